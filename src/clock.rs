//! The wall clock, shared by the router (which period a read targets) and
//! the shards (which period a write lands in).
//!
//! Tests move it: `RANKD_DEBUG_CLOCK_OFFSET_SECS` shifts the server's clock
//! so a test can start a few seconds before a day, week or month boundary and
//! watch the real binary roll over. It is read once at start and never meant
//! for production.

use std::time::{SystemTime, UNIX_EPOCH};

/// Environment variable holding the test-only clock offset, in seconds.
pub const OFFSET_ENV: &str = "RANKD_DEBUG_CLOCK_OFFSET_SECS";

/// Unix time in seconds (UTC), optionally shifted.
#[derive(Debug, Clone, Copy, Default)]
pub struct Clock {
    offset_secs: i64,
}

impl Clock {
    /// The system clock shifted by `offset_secs`.
    pub fn with_offset(offset_secs: i64) -> Self {
        Self { offset_secs }
    }

    /// The system clock, shifted by [`OFFSET_ENV`] if it is set.
    pub fn from_env() -> Self {
        let offset = std::env::var(OFFSET_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
        if offset != 0 {
            tracing::warn!(offset_secs = offset, "clock shifted for testing ({OFFSET_ENV})");
        }
        Self::with_offset(offset)
    }

    /// Now, in Unix seconds.
    pub fn now(&self) -> i64 {
        let since = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        since + self.offset_secs
    }
}
