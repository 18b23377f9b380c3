//! A listener's cap on open connections: each accepted connection holds a place
//! for as long as it is open; past the cap a new one is closed at accept, before
//! anything is read from it (and counted), so descriptors left for the other
//! listeners, the stores and the providers are never taken by one listener's
//! clients.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[derive(Clone)]
pub(crate) struct ConnectionCap {
    name: &'static str,
    max: usize,
    open: Arc<AtomicUsize>,
}

/// A connection's place under its listener's cap; given back when dropped.
pub(crate) struct Held {
    name: &'static str,
    open: Arc<AtomicUsize>,
}

impl ConnectionCap {
    /// `name` is the listener's metric label (gateway, web, ops).
    pub(crate) fn new(name: &'static str, max: usize) -> ConnectionCap {
        ConnectionCap {
            name,
            max: max.max(1),
            open: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A place for a new connection, or `None` (counted) when the cap is held.
    pub(crate) fn take(&self) -> Option<Held> {
        let m = crate::metrics::global();
        let taken = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok();
        if !taken {
            m.refused_connections.with_label_values(&[self.name]).inc();
            return None;
        }
        m.open_connections.with_label_values(&[self.name]).inc();
        Some(Held {
            name: self.name,
            open: self.open.clone(),
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
        crate::metrics::global()
            .open_connections
            .with_label_values(&[self.name])
            .dec();
    }
}

/// The process's open-file limit (`RLIMIT_NOFILE`, soft); 1024 where unknown.
pub(crate) fn descriptor_limit() -> usize {
    #[cfg(target_os = "linux")]
    {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given and nothing else.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } == 0 {
            return usize::try_from(l.rlim_cur).unwrap_or(usize::MAX);
        }
    }
    1024
}
