//! Waiting on a condition instead of sleeping for a guessed time: a test
//! that sleeps is slow on a fast machine and flaky on a loaded one, while
//! one that polls what it waits for is neither. Part of the `testkit`
//! feature.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often [`eventually`] and [`eventually_blocking`] look again.
pub const POLL_EVERY: Duration = Duration::from_millis(25);

/// Polls `check` until it answers `Ok`, and gives that answer.
///
/// `check` answers `Err` with what it saw instead; once `within` has
/// passed, this panics with the last of those, so a failing test says what
/// the condition looked like when it gave up.
pub async fn eventually<T, F, Fut>(within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = crate::clock::now() + within;
    loop {
        match check().await {
            Ok(done) => return done,
            Err(seen) if crate::clock::now() >= deadline => {
                panic!("not so within {within:?}: {seen}")
            }
            Err(_) => tokio::time::sleep(POLL_EVERY).await,
        }
    }
}

/// [`eventually`] for tests that drive processes from a plain thread.
pub fn eventually_blocking<T, F>(within: Duration, mut check: F) -> T
where
    F: FnMut() -> Result<T, String>,
{
    let deadline = crate::clock::now() + within;
    loop {
        match check() {
            Ok(done) => return done,
            Err(seen) if crate::clock::now() >= deadline => {
                panic!("not so within {within:?}: {seen}")
            }
            Err(_) => std::thread::sleep(POLL_EVERY),
        }
    }
}

/// Polls `check` until it gives `Some`, for at most `within`: its answer,
/// or `None` once the time has passed (for a caller that cleans up, or
/// says more, before it fails).
pub fn poll_until<T>(within: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = crate::clock::now() + within;
    loop {
        if let Some(done) = check() {
            return Some(done);
        }
        if crate::clock::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL_EVERY);
    }
}

/// One more turn of a hand-written polling loop, for loops that
/// [`eventually`]'s closure does not fit (one that breaks with a value
/// from deep inside, or keeps what it saw across turns): panics with
/// `seen()` once `deadline` has passed, otherwise waits [`POLL_EVERY`].
pub fn poll_again(deadline: Instant, seen: impl FnOnce() -> String) {
    assert!(
        crate::clock::now().into_std() < deadline,
        "not so in time: {}",
        seen()
    );
    std::thread::sleep(POLL_EVERY);
}

/// [`poll_again`] in a task.
pub async fn poll_again_async(deadline: Instant, seen: impl FnOnce() -> String) {
    assert!(
        crate::clock::now().into_std() < deadline,
        "not so in time: {}",
        seen()
    );
    tokio::time::sleep(POLL_EVERY).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn gives_the_first_ok_answer() {
        let tries = AtomicU32::new(0);
        let got = eventually(Duration::from_secs(5), || async {
            match tries.fetch_add(1, Ordering::Relaxed) {
                n if n >= 2 => Ok(n),
                n => Err(format!("try {n}")),
            }
        })
        .await;
        assert_eq!(got, 2);
    }

    #[test]
    #[should_panic(expected = "not so in time: gone")]
    fn a_turn_past_the_deadline_panics() {
        poll_again(crate::clock::now().into_std(), || "gone".into());
    }

    #[test]
    #[should_panic(expected = "not so within 50ms: still 7")]
    fn panics_with_what_it_last_saw() {
        eventually_blocking(Duration::from_millis(50), || Err::<(), _>("still 7".into()));
    }
}
