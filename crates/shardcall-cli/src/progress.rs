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

#[cfg(test)]
mod tests {
    #[test]
    fn hidden_when_stderr_is_not_a_terminal() {
        // Tests run with stderr captured, as in CI.
        assert!(super::bar(Some(10), "x").is_hidden());
        assert!(super::bar(None, "x").is_hidden());
    }
}
