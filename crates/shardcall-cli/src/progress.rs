//! Progress bars for long operations, drawn on stderr only when it is a
//! terminal (pipes, files and CI logs get nothing).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar of `len` steps (or a counter when `len` is `None`) labelled `what`,
/// hidden unless stderr is a terminal.
pub fn bar(len: Option<u64>, what: &str) -> ProgressBar {
    let pb = match len {
        Some(n) => ProgressBar::new(n).with_style(
            ProgressStyle::with_template(
                "{msg:>14} [{bar:40}] {pos}/{len} ({per_sec}, {eta} left)",
            )
            .expect("valid template")
            .progress_chars("=> "),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{spinner} {msg} {pos} ({per_sec})")
                .expect("valid template"),
        ),
    };
    pb.set_message(what.to_owned());
    if !std::io::stderr().is_terminal() {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    }
    pb
}

/// Bytes the way people read them: `512 B`, `12.3 KiB`, `4.0 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::human_bytes;

    #[test]
    fn hidden_when_stderr_is_not_a_terminal() {
        // Tests run with stderr captured, as in CI.
        assert!(super::bar(Some(10), "x").is_hidden());
        assert!(super::bar(None, "x").is_hidden());
    }

    #[test]
    fn bytes_read_as_people_write_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 << 30), "5.0 GiB");
    }
}
