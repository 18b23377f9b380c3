//! Background threads yield the core to requests.
//!
//! The gateway's threads keep the default policy, with a short slice
//! ([`serving`]). Every thread of background
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
pub fn background(nice: i32) {
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

/// The scheduler slice a thread serving requests asks for: the shortest Linux
/// grants (it clamps to 0.1–100 ms).
pub const SERVING_SLICE_NS: u64 = 100_000;

/// Makes the calling thread a request-serving one, once per thread: a short
/// scheduler slice ([`SERVING_SLICE_NS`] rather than the default 0.75 ms times
/// the log of the core count), nothing else changed. Linux's scheduler (EEVDF,
/// 6.12 and later) lets a waking thread with the shorter slice preempt a running
/// one at once, where the default only preempts at the end of the running one's
/// slice. The running one that matters is a database process on the same core:
/// a PostgreSQL backend is its own session, so its own scheduling group, and
/// neither our nice values nor `SCHED_BATCH` reach it. Earlier kernels ignore the
/// slice; a sandbox that refuses the call leaves the default.
pub fn serving() {
    #[cfg(target_os = "linux")]
    {
        thread_local!(static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
        if DONE.get() {
            return;
        }
        DONE.set(true);
        let mut attr = SchedAttr::default();
        let size = std::mem::size_of::<SchedAttr>() as u32;
        // SAFETY: both calls read or write only `attr`, of the size given; `0`
        // names the calling thread.
        unsafe {
            if libc::syscall(libc::SYS_sched_getattr, 0, &mut attr, size, 0) != 0 {
                return;
            }
            attr.size = size;
            attr.sched_flags = 0;
            attr.sched_runtime = SERVING_SLICE_NS;
            libc::syscall(libc::SYS_sched_setattr, 0, &attr, 0);
        }
    }
}

/// `struct sched_attr` of `sched_setattr(2)` (libc has no binding for it).
#[cfg(target_os = "linux")]
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
    sched_util_min: u32,
    sched_util_max: u32,
}

/// The calling thread's scheduler slice in nanoseconds, as Linux reports it.
#[cfg(all(test, target_os = "linux"))]
fn slice() -> u64 {
    let mut attr = SchedAttr::default();
    // SAFETY: writes only `attr`, of the size given.
    unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &mut attr,
            std::mem::size_of::<SchedAttr>() as u32,
            0,
        )
    };
    attr.sched_runtime
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

    #[test]
    fn a_serving_thread_asks_for_the_short_slice_and_keeps_its_nice_value() {
        let (before, after, nice) = std::thread::spawn(|| {
            // SAFETY: sets the calling thread's own nice value.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 3) };
            let before = super::slice();
            super::serving();
            // SAFETY: a plain read of the calling thread's own nice value.
            let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
            (before, super::slice(), nice)
        })
        .join()
        .unwrap();
        assert_eq!(nice, 3, "the nice value stays");
        // Kernels before 6.12 report no slice (0) and keep none.
        if before != 0 {
            assert_eq!(after, super::SERVING_SLICE_NS);
        }
    }
}
