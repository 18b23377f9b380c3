//! Background threads yield the core to requests.
//!
//! The gateway's threads keep the default policy. Every thread of background
//! work runs under `SCHED_BATCH` at a nice value of its own: the state runtime
//! (refreshers, leases, pollers, and the SQLite workers it opens), the usage
//! writer, the batch lines, and Pingora's timer clock ([`crate::deadline`]).
//! Linux never lets a batch thread preempt a running thread when it wakes, so
//! a refresher's tick waits for the gateway to block or end its slice, and so
//! do the PostgreSQL and Redis round trips it would start. Under load a batch
//! thread still gets the core in proportion to its weight: leases are renewed
//! and usage is written, just not in the middle of a request.
//!
//! Why: a scheduler trace of the production configuration at c=1 (PostgreSQL
//! and Redis on the gateway's core, as in `benches/load`) showed the gateway
//! preempted while serving on 2.3% of requests, for up to 1.4 ms: by the state
//! runtime's refresh round trips and Pingora's 10 ms timer tick. That was the
//! c=1 p99.

/// Makes the calling thread background work at `nice` (Linux policy and nice
/// values are per thread); threads it starts inherit both.
pub(crate) fn background(nice: i32) {
    #[cfg(target_os = "linux")]
    // SAFETY: both calls only read their arguments; `0` names the calling thread.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(0, libc::SCHED_BATCH, &param);
        libc::setpriority(libc::PRIO_PROCESS, 0, nice);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    fn a_background_thread_is_batch_work_at_its_nice_value() {
        let (policy, nice, child) = std::thread::spawn(|| {
            super::background(7);
            // SAFETY: plain reads of the calling thread's own settings.
            let read = || unsafe {
                (
                    libc::sched_getscheduler(0),
                    libc::getpriority(libc::PRIO_PROCESS, 0),
                )
            };
            let (policy, nice) = read();
            let child = std::thread::spawn(read).join().unwrap();
            (policy, nice, child)
        })
        .join()
        .unwrap();
        assert_eq!((policy, nice), (libc::SCHED_BATCH, 7));
        assert_eq!(
            child,
            (libc::SCHED_BATCH, 7),
            "threads it starts inherit both"
        );
        // SAFETY: as above, on the test's own thread.
        let own = unsafe { libc::sched_getscheduler(0) };
        assert_eq!(own, libc::SCHED_OTHER, "only the calling thread changes");
    }
}
