//! The bound on what an instance has admitted and not yet committed: inference
//! requests between their head and their first content (authenticating, reading
//! the body, at the gates, waiting on a rung: the window in which fail-over may
//! still replay them). Past `[limits] max_pending` a new one is answered 429
//! `gateway_overloaded` with `Retry-After` before anything is read of it, instead
//! of queueing behind the others: a client retries on another instance, and the
//! admitted keep their latency. A stream that committed no longer counts (10,000
//! open streams are no overload); a whole answer counts until it is written.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub(crate) struct Pending {
    max: usize,
    now: Arc<AtomicUsize>,
}

/// One admitted request's place; given back at its commit (`Tally::commit`) or
/// when the request ends, whichever is first.
#[derive(Debug)]
pub(crate) struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Pending {
    pub(crate) fn new(max: usize) -> Pending {
        Pending {
            max: max.max(1),
            now: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A place, or `None` when `max` are taken.
    pub(crate) fn admit(&self) -> Option<Place> {
        self.now
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| Place(self.now.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_and_given_back() {
        let p = Pending::new(2);
        let a = p.admit().unwrap();
        let _b = p.admit().unwrap();
        assert!(p.admit().is_none());
        drop(a);
        assert!(p.admit().is_some());
    }
}
