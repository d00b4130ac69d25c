//! Why something failed, as the engines are told it: the error itself,
//! its type and its chain of sources kept (a driver can downcast it, a log
//! can print every source), shown as text only where a report needs text.
//! The engines decide from the variant it arrives in (fenced, failed,
//! stuck...), never from the text.

use std::fmt;
use std::sync::Arc;

/// An error kept whole, cheap to clone (engines hold on to causes while
/// they retry, and hand them to reports).
#[derive(Clone)]
pub struct Cause(Arc<dyn std::error::Error + Send + Sync + 'static>);

/// A cause that is a message alone.
#[derive(Debug)]
struct Message(String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Message {}

impl Cause {
    /// The cause `error`.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(error))
    }

    /// A cause already shared.
    pub fn from_arc(error: Arc<dyn std::error::Error + Send + Sync + 'static>) -> Self {
        Self(error)
    }

    /// A cause that is `message` alone.
    pub fn msg(message: impl fmt::Display) -> Self {
        Self(Arc::new(Message(message.to_string())))
    }

    /// The error.
    pub fn error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }

    /// The error as `E`, if it is one.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref::<E>()
    }
}

impl fmt::Display for Cause {
    /// The error, then (with `{:#}`) each of its sources after a colon,
    /// but for a source the text so far already says (an error that puts
    /// its source in its own message).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = self.0.to_string();
        if f.alternate() {
            let mut source = self.0.source();
            while let Some(s) = source {
                let said = s.to_string();
                if !text.contains(&said) {
                    text = format!("{text}: {said}");
                }
                source = s.source();
            }
        }
        f.write_str(&text)
    }
}

impl fmt::Debug for Cause {
    /// As its text, so that an engine's event in a test's output reads as
    /// what happened.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", format!("{self:#}"))
    }
}

/// Two causes are equal when they say the same: engines never compare
/// causes, their tests compare the events that carry them.
impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        format!("{self:#}") == format!("{other:#}")
    }
}

impl Eq for Cause {}

impl From<String> for Cause {
    fn from(message: String) -> Self {
        Self::msg(message)
    }
}

impl From<&str> for Cause {
    fn from(message: &str) -> Self {
        Self::msg(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn keeps_the_error_its_type_and_its_sources() {
        let cause = Cause::new(Outer(std::io::Error::other("inner")));
        assert_eq!(cause.to_string(), "outer");
        assert_eq!(format!("{cause:#}"), "outer: inner");
        assert!(cause.downcast_ref::<Outer>().is_some());
        assert_eq!(cause, Cause::msg("outer: inner"));
    }

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Saying(#[source] std::io::Error);

    #[test]
    fn a_source_the_message_already_says_is_not_said_twice() {
        let cause = Cause::new(Saying(std::io::Error::other("inner")));
        assert_eq!(format!("{cause:#}"), "outer: inner");
    }
}
