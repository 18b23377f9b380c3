//! A circuit breaker per rung (provider, model id, base URL, credential; never per
//! host): after `threshold` consecutive failures the rung is skipped for `cooldown`;
//! then one request at a time may probe it (half-open) until one succeeds.
//! Each opening is counted, and each rung's state is a gauge, under the rung's
//! [`Series`] (`sluice_breaker_opens_total`, `sluice_breaker_open`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    failures: u32,
    open_until: Option<Instant>,
    probing: bool,
}

/// The labels a rung's breaker is counted under: its provider, and its catalog
/// rung id (`byok` for every org's own rung, which are not the operator's to
/// watch one by one and would grow the series with each org).
#[derive(Clone, Copy, Debug)]
pub struct Series<'a> {
    pub provider: &'a str,
    pub rung: &'a str,
}

pub struct Breaker {
    states: Mutex<HashMap<String, State>>,
    threshold: u32,
    cooldown: Duration,
}

/// What the breaker lets through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    Yes,
    /// The one half-open probe after a cool-down.
    Probe,
    No,
}

impl Breaker {
    pub fn new(threshold: u32, cooldown: Duration) -> Breaker {
        Breaker {
            states: Mutex::new(HashMap::new()),
            threshold: threshold.max(1),
            cooldown,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, State>> {
        self.states.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn admit(&self, key: &str) -> Admit {
        let mut m = self.lock();
        let Some(s) = m.get_mut(key) else {
            return Admit::Yes;
        };
        match s.open_until {
            None => Admit::Yes,
            Some(t) if Instant::now() < t => Admit::No,
            Some(_) if s.probing => Admit::No,
            Some(_) => {
                s.probing = true;
                Admit::Probe
            }
        }
    }

    /// Whether [`Breaker::admit`] would let a request through now, without taking
    /// the half-open probe slot.
    pub fn would_admit(&self, key: &str) -> bool {
        match self.lock().get(key) {
            None => true,
            Some(s) => match s.open_until {
                None => true,
                Some(t) => Instant::now() >= t && !s.probing,
            },
        }
    }

    pub fn success(&self, key: &str, series: Series) {
        let mut m = self.lock();
        if let Some(s) = m.remove(key) {
            if s.open_until.is_some() {
                crate::metrics::global().breaker_closed(series.provider, series.rung);
            }
        }
    }

    pub fn failure(&self, key: &str, series: Series) {
        let mut m = self.lock();
        let s = m.entry(key.to_string()).or_default();
        s.failures += 1;
        if s.probing || s.failures >= self.threshold {
            if s.open_until.is_none() {
                crate::metrics::global().breaker_opened(series.provider, series.rung);
            }
            s.open_until = Some(Instant::now() + self.cooldown);
            s.probing = false;
        }
    }

    /// Releases a probe that ended neither way (the client left, say).
    pub fn abandon(&self, key: &str) {
        if let Some(s) = self.lock().get_mut(key) {
            s.probing = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_then_probes_once() {
        let b = Breaker::new(2, Duration::from_millis(30));
        let sr = Series {
            provider: "mistral",
            rung: "mistral:breaker-unit-test",
        };
        let m = crate::metrics::global();
        let open = || {
            m.breaker_open
                .with_label_values(&[sr.provider, sr.rung])
                .get()
        };
        let opens = || {
            m.breaker_opens
                .with_label_values(&[sr.provider, sr.rung])
                .get()
        };
        assert_eq!(b.admit("r"), Admit::Yes);
        b.failure("r", sr);
        assert_eq!(b.admit("r"), Admit::Yes);
        b.failure("r", sr);
        assert_eq!(b.admit("r"), Admit::No);
        assert_eq!((open(), opens()), (1, 1), "counted open once");
        assert_eq!(b.admit("other"), Admit::Yes, "per rung, not global");
        assert!(!b.would_admit("r"));
        std::thread::sleep(Duration::from_millis(40));
        assert!(b.would_admit("r"));
        assert!(b.would_admit("r"), "asking does not take the probe slot");
        assert_eq!(b.admit("r"), Admit::Probe);
        assert!(!b.would_admit("r"));
        assert_eq!(b.admit("r"), Admit::No, "one probe at a time");
        b.failure("r", sr);
        assert_eq!(b.admit("r"), Admit::No, "a failed probe reopens");
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(b.admit("r"), Admit::Probe);
        b.success("r", sr);
        assert_eq!(b.admit("r"), Admit::Yes, "a good probe closes");
        assert_eq!(
            (open(), opens()),
            (0, 1),
            "a reopened probe is the same opening"
        );
    }
}
