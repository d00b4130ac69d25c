//! Isolating the records that make a batch fail, so only they go to the
//! dead letters: the failing batch is retried in halves, in offset order,
//! each half that passes is kept, and a half that fails is split again
//! until a record fails on its own.
//!
//! Sans-IO: [`Bisect`] says which records to try next and learns how it
//! went; the runtime makes the handler calls, checkpoints what passed and
//! dead-letters what it is told to. Order is kept: a range is tried only
//! after every record before it was processed or dead-lettered.

use std::ops::Range;

/// What to do next with the failing batch (indices into it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BisectStep {
    /// Run the handler on these records; then report with
    /// [`Bisect::passed`] or [`Bisect::failed`].
    Try(Range<usize>),
    /// This record failed on its own: send it to the dead letters (and move
    /// past it); then call [`Bisect::next_step`] again.
    DeadLetter(usize),
    /// Every record was processed or dead-lettered.
    Done,
}

/// The bisection of one failing batch of `len` records.
#[derive(Debug, Clone)]
pub struct Bisect {
    /// Ranges still to try, the next one last.
    todo: Vec<Range<usize>>,
    /// The range tried last, waiting for its outcome.
    trying: Option<Range<usize>>,
    /// A record that failed alone, to hand out next.
    poison: Option<usize>,
}

impl Bisect {
    /// A batch of `len` records that failed as a whole: its halves are
    /// tried first.
    pub fn new(len: usize) -> Self {
        let mut b = Self {
            todo: Vec::new(),
            trying: None,
            poison: None,
        };
        b.split(0..len);
        b
    }

    fn split(&mut self, r: Range<usize>) {
        match r.len() {
            0 => {}
            1 => self.poison = Some(r.start),
            n => {
                let mid = r.start + n / 2;
                self.todo.push(mid..r.end);
                self.todo.push(r.start..mid);
            }
        }
    }

    /// The next step.
    ///
    /// # Panics
    /// If the last `Try` has not been reported.
    pub fn next_step(&mut self) -> BisectStep {
        assert!(self.trying.is_none(), "report the last try first");
        if let Some(i) = self.poison.take() {
            return BisectStep::DeadLetter(i);
        }
        match self.todo.pop() {
            Some(r) => {
                self.trying = Some(r.clone());
                BisectStep::Try(r)
            }
            None => BisectStep::Done,
        }
    }

    /// The last range passed (it was processed and checkpointed).
    pub fn passed(&mut self) {
        self.trying.take().expect("a range was being tried");
    }

    /// The last range failed: its halves are tried next, or, for a single
    /// record, it goes to the dead letters.
    pub fn failed(&mut self) {
        let r = self.trying.take().expect("a range was being tried");
        if r.len() == 1 {
            self.poison = Some(r.start);
        } else {
            self.split(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Runs a bisection of `len` records where `bad` records fail any range
    /// holding them: the records processed and dead-lettered, in order, and
    /// how many tries it took.
    fn run(len: usize, bad: &[usize]) -> (Vec<usize>, Vec<usize>, usize) {
        let mut b = Bisect::new(len);
        let (mut done, mut dead, mut tries) = (Vec::new(), Vec::new(), 0);
        loop {
            match b.next_step() {
                BisectStep::Try(r) => {
                    tries += 1;
                    if r.clone().any(|i| bad.contains(&i)) {
                        b.failed();
                    } else {
                        done.extend(r);
                        b.passed();
                    }
                }
                BisectStep::DeadLetter(i) => dead.push(i),
                BisectStep::Done => return (done, dead, tries),
            }
        }
    }

    #[test]
    fn one_poison_record_is_isolated_and_the_rest_processed_in_order() {
        let (done, dead, tries) = run(8, &[5]);
        assert_eq!(dead, [5]);
        assert_eq!(done, [0, 1, 2, 3, 4, 6, 7]);
        assert!(tries <= 2 * 3 + 1, "{tries} tries");
    }

    #[test]
    fn a_single_record_batch_goes_to_the_dead_letters_at_once() {
        assert_eq!(run(1, &[0]), (vec![], vec![0], 0));
    }

    proptest! {
        /// Every record is processed or dead-lettered exactly once, in
        /// offset order; exactly the bad ones are dead-lettered; each bad
        /// record costs at most about two tries per halving.
        #[test]
        fn bisection_keeps_order_and_isolates_exactly_the_bad(
            len in 1usize..200,
            bad in proptest::collection::btree_set(0usize..200, 1..6),
        ) {
            let bad: Vec<usize> = bad.into_iter().filter(|&i| i < len).collect();
            prop_assume!(!bad.is_empty());
            let (done, dead, tries) = run(len, &bad);
            prop_assert_eq!(&dead, &bad);
            let mut all: Vec<usize> = done.iter().chain(&dead).copied().collect();
            all.sort_unstable();
            prop_assert_eq!(all, (0..len).collect::<Vec<_>>());
            // In order: a record is handled after every record before it.
            let mut order: Vec<(usize, usize)> = Vec::new();
            let mut b = Bisect::new(len);
            let mut step = 0;
            loop {
                match b.next_step() {
                    BisectStep::Try(r) => {
                        if r.clone().any(|i| bad.contains(&i)) { b.failed() } else {
                            order.extend(r.map(|i| (step, i)));
                            b.passed();
                        }
                    }
                    BisectStep::DeadLetter(i) => order.push((step, i)),
                    BisectStep::Done => break,
                }
                step += 1;
            }
            let indices: Vec<usize> = order.iter().map(|(_, i)| *i).collect();
            prop_assert_eq!(indices, (0..len).collect::<Vec<_>>());
            let depth = usize::BITS - len.leading_zeros();
            prop_assert!(tries <= bad.len() * 2 * depth as usize + 2, "{} tries", tries);
        }
    }
}
