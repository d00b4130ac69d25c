//! Behaving like a Unix tool in a pipe: when the reader of stdout goes away
//! (`shardcall consume ... | head -1`), the command ends quietly instead of
//! panicking or printing an error.

use std::io::ErrorKind;

/// Ends the process quietly (exit status 0) when printing to stdout fails
/// because its reader closed the pipe; any other panic is reported as usual.
pub fn quiet_on_closed_pipe() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        report(info);
    }));
}

/// Whether `e` comes from writing to a pipe whose reader went away.
pub fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == ErrorKind::BrokenPipe)
    })
}
