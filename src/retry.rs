//! Exponential backoff with jitter, shared by the operator's per-object retries and the
//! bridge's pass retries: each doubles from `base` up to `max`, stretched or shrunk by up to a
//! fifth so that what failed together (an API server outage) does not retry in lockstep.

use std::time::Duration;

/// A doubling delay between `base` and `max`.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The delay after `failures` consecutive failures (1 for the first), with fresh jitter.
    pub fn delay(&self, failures: u32) -> Duration {
        self.with_jitter(failures, jitter())
    }

    /// `jitter` in [0, 1): 0 shrinks by a fifth, 0.5 keeps the doubling value, 1 stretches by
    /// a fifth.
    fn with_jitter(&self, failures: u32, jitter: f64) -> Duration {
        let exp = failures.saturating_sub(1).min(16);
        let base = self.base.saturating_mul(1 << exp).min(self.max);
        base.mul_f64(0.8 + 0.4 * jitter.clamp(0.0, 1.0))
    }
}

/// A number in [0, 1), different every call. std's RandomState is seeded randomly per thread
/// and per instance, which is all jitter needs; no random-number crate for this.
fn jitter() -> f64 {
    use std::hash::BuildHasher;
    let bits = std::hash::RandomState::new().hash_one(std::time::SystemTime::now());
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const BACKOFF: Backoff = Backoff { base: Duration::from_secs(2), max: Duration::from_secs(300) };

    #[test]
    fn backoff_doubles_and_caps_within_its_jitter() {
        let mid = |failures| BACKOFF.with_jitter(failures, 0.5);
        assert_eq!(mid(1), Duration::from_secs(2));
        assert_eq!(mid(2), Duration::from_secs(4));
        assert_eq!(mid(5), Duration::from_secs(32));
        assert_eq!(mid(9), BACKOFF.max);
        assert_eq!(mid(u32::MAX), BACKOFF.max);
        assert_eq!(BACKOFF.with_jitter(1, 0.0), Duration::from_millis(1600));
        assert!(BACKOFF.with_jitter(1, 0.999_999) < Duration::from_millis(2400));
        assert_eq!(BACKOFF.with_jitter(1, 7.0), Duration::from_millis(2400), "out-of-range jitter is clamped");
        // Drawn values differ and stay in range.
        let drawn: std::collections::HashSet<u64> = (0..50).map(|_| jitter().to_bits()).collect();
        assert!(drawn.len() > 40);
        assert!((0..1000).map(|_| jitter()).all(|j| (0.0..1.0).contains(&j)));
    }
}
