//! The node's decision log kept to a rate: a token bucket of `per_second` tokens, as deep as one
//! second's worth, over tokio's clock. What it turns away is counted, so the log can say how many
//! decisions it left out ([`RateLimit::take_suppressed`]).

use tokio::time::Instant;

/// A token bucket: `per_second` a second, at most `per_second` saved up.
#[derive(Debug)]
pub struct RateLimit {
    per_second: f64,
    tokens: f64,
    last: Instant,
    suppressed: u64,
}

impl RateLimit {
    /// A full bucket (`per_second` of 0 lets nothing through).
    pub fn new(per_second: u32) -> Self {
        Self {
            per_second: f64::from(per_second),
            tokens: f64::from(per_second),
            last: Instant::now(),
            suppressed: 0,
        }
    }

    /// Whether one more decision may be logged now (if not, it is counted as suppressed).
    pub fn admit(&mut self) -> bool {
        let now = Instant::now();
        let earned = now.duration_since(self.last).as_secs_f64() * self.per_second;
        self.tokens = (self.tokens + earned).min(self.per_second);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.suppressed += 1;
            false
        }
    }

    /// The decisions turned away since the last call.
    pub fn take_suppressed(&mut self) -> u64 {
        std::mem::take(&mut self.suppressed)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_is_cut_at_the_rate_and_the_rest_counted() {
        let mut limit = RateLimit::new(10);
        let admitted = (0..25).filter(|_| limit.admit()).count();
        assert_eq!(admitted, 10, "a full bucket: one second's worth");
        assert_eq!(limit.take_suppressed(), 15);
        assert_eq!(limit.take_suppressed(), 0, "counted once");
        // A tenth of a second earns one more.
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(limit.admit());
        assert!(!limit.admit());
        // A quiet minute saves up no more than a second's worth.
        tokio::time::advance(Duration::from_secs(60)).await;
        let admitted = (0..25).filter(|_| limit.admit()).count();
        assert_eq!(admitted, 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_of_zero_lets_nothing_through() {
        let mut limit = RateLimit::new(0);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(!limit.admit());
        assert_eq!(limit.take_suppressed(), 1);
    }
}
