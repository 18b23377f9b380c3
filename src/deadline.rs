//! Timeouts on Pingora's timer: coarse (10 ms) and free of the per-timer driver
//! wake-ups of Tokio's, which cost a syscall each on the request path.
//!
//! Pingora keeps one timer per 10 ms slot, shared by every timeout that ends in
//! it, and a timer stays registered until its slot passes, even after the future
//! it bounded has finished. A request's deadline (10 minutes) taken at a new slot
//! every 10 ms kept 60,000 of them alive at once: 7 MB, the whole of a streaming
//! soak's growth. So a far deadline is rounded up to a coarser grid on one
//! process-wide epoch, and the timeouts taken in the same second share a slot:
//! - 60 s or more away: to the next whole second (at most 1.7% late);
//! - 5 s or more away: to the next 100 ms (at most 2% late);
//! - nearer: Pingora's own 10 ms.
//!
//! Never early: a caller that compares `Instant::now()` with its deadline after a
//! timeout sees it passed. The bound, per thread, for the longest timeout T
//! seconds: about T slots of a second, 550 of 100 ms and 500 of 10 ms (doubled at
//! worst where our epoch and Pingora's straddle a slot's edge), some 115 bytes
//! each: under 400 KB for T = 600.

use pingora::time::fast_timeout::fast_timeout;
use pingora::time::Elapsed;
use std::future::Future;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Waits for `fut` until `deadline` (or a little after it: see the module's note).
pub(crate) fn until<F: Future>(
    deadline: Instant,
    fut: F,
) -> impl Future<Output = Result<F::Output, Elapsed>> {
    // Not an async fn: that would move `fut` into its own state and then again
    // into the timeout's, a copy of the whole future each time.
    fast_timeout(wait(deadline, Instant::now()), fut)
}

/// Waits for `fut` for `d` (or a little longer: see the module's note).
pub(crate) fn within<F: Future>(
    d: Duration,
    fut: F,
) -> impl Future<Output = Result<F::Output, Elapsed>> {
    let now = Instant::now();
    fast_timeout(wait(now + d, now), fut)
}

/// Starts Pingora's timer clock (a thread that wakes every 10 ms to fire the
/// timers due) from a background thread, whose policy it inherits (see
/// [`crate::priority`]): otherwise it starts on the first request's thread and
/// its tick preempts requests. Before any other timeout, at startup.
pub(crate) fn start_clock() {
    let started = std::thread::Builder::new()
        .name("sluice-clock".into())
        .spawn(|| {
            crate::priority::background(0);
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a runtime with no driver");
            // The first timer registered starts the clock.
            rt.block_on(pingora::time::sleep(Duration::from_millis(1)));
        });
    if let Ok(t) = started {
        let _ = t.join();
    }
}

/// How long to wait from `now` for `deadline`, rounded up to its grid.
fn wait(deadline: Instant, now: Instant) -> Duration {
    let left = deadline.saturating_duration_since(now);
    let grid = if left >= Duration::from_secs(60) {
        1_000_000_000
    } else if left >= Duration::from_secs(5) {
        100_000_000
    } else {
        return left;
    };
    let epoch = *EPOCH;
    let since = deadline.saturating_duration_since(epoch).as_nanos();
    let rounded = since.div_ceil(grid) * grid;
    let target = epoch + Duration::from_nanos(rounded as u64);
    target.saturating_duration_since(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn far_deadlines_share_a_whole_second_and_are_never_early() {
        let now = Instant::now();
        let mut ends = std::collections::HashSet::new();
        // A deadline 10 minutes ahead, taken every millisecond for a second.
        for ms in 0..1000 {
            let at = now + Duration::from_millis(ms);
            let deadline = at + Duration::from_secs(600);
            let w = wait(deadline, at);
            assert!(at + w >= deadline, "early by {:?}", deadline - (at + w));
            assert!(w <= Duration::from_secs(601));
            ends.insert((at + w).duration_since(*EPOCH).as_millis());
        }
        assert!(ends.len() <= 2, "{} distinct ends", ends.len());
    }

    #[test]
    fn middle_deadlines_round_to_100_ms_and_near_ones_stay_exact() {
        let now = Instant::now();
        let w = wait(now + Duration::from_secs(30), now);
        assert!(w >= Duration::from_secs(30) && w <= Duration::from_millis(30_100));
        let end = (now + w).duration_since(*EPOCH).as_nanos();
        assert_eq!(end % 100_000_000, 0);
        assert_eq!(
            wait(now + Duration::from_millis(1234), now),
            Duration::from_millis(1234)
        );
        assert_eq!(wait(now, now + Duration::from_secs(1)), Duration::ZERO);
    }

    #[tokio::test]
    async fn a_timeout_ends_a_pending_future_and_passes_a_ready_one() {
        assert!(
            within(Duration::from_millis(20), std::future::pending::<()>())
                .await
                .is_err()
        );
        assert_eq!(
            within(Duration::from_secs(600), async { 7 }).await.unwrap(),
            7
        );
    }
}
