//! Finding the servers that benchmarks and tests start (brokers, object
//! stores), which the test command installs into `~/.cargo/bin`.

use std::path::PathBuf;

/// Where the program `name` is: the path in the environment variable
/// `var`, then `name` on `PATH`, then `~/.cargo/bin/name`.
pub fn installed_binary(var: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var).map(PathBuf::from)
        && p.is_file()
    {
        return Some(p);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let p = PathBuf::from(std::env::var_os("HOME")?)
            .join(".cargo/bin")
            .join(name);
        p.is_file().then_some(p)
    })
}
