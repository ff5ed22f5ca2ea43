//! Time in the two forms the daemon uses: tokio's clock for everything that waits or orders (so
//! `tokio::time::pause` drives every timer in tests), and unix milliseconds for what the state file
//! keeps across restarts. The conversions between them live here.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// Wall-clock now, in unix milliseconds (what the store keeps).
pub fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A wall-clock time from the store as a tokio instant (clamped to now for future or ancient times).
pub fn instant_from_unix_ms(ms: u64, now: Instant, now_ms: u64) -> Instant {
    now.checked_sub(Duration::from_millis(now_ms.saturating_sub(ms)))
        .unwrap_or(now)
}

/// A tokio instant as a wall-clock time for the store.
pub fn unix_ms_from_instant(at: Instant, now: Instant, now_ms: u64) -> u64 {
    if at >= now {
        now_ms + (at - now).as_millis() as u64
    } else {
        now_ms.saturating_sub((now - at).as_millis() as u64)
    }
}

/// A tokio instant as a wall-clock time for the store, against now.
pub fn to_unix_ms(at: Instant) -> u64 {
    unix_ms_from_instant(at, Instant::now(), unix_ms_now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn instants_and_unix_ms_round_trip() {
        let now = Instant::now();
        let now_ms = 1_000_000;
        let later = now + Duration::from_secs(5);
        assert_eq!(unix_ms_from_instant(later, now, now_ms), 1_005_000);
        let earlier = now - Duration::from_secs(3);
        assert_eq!(unix_ms_from_instant(earlier, now, now_ms), 997_000);
        assert_eq!(instant_from_unix_ms(997_000, now, now_ms), earlier);
        // Future times clamp to now.
        assert_eq!(instant_from_unix_ms(2_000_000, now, now_ms), now);
    }
}
