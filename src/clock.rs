//! The wall clock, shared by the router (which period a read targets) and
//! the shards (which period a write lands in).

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix time in seconds (UTC); tests may shift it (`test-hooks`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Clock {
    /// Seconds added to the system clock: 0 but in tests (`test-hooks`).
    offset_secs: i64,
}

impl Clock {
    /// The system clock shifted by `offset_secs`, so a test can start just
    /// before a period boundary and watch the real binary roll over.
    #[cfg(feature = "test-hooks")]
    pub fn with_offset(offset_secs: i64) -> Self {
        if offset_secs != 0 {
            tracing::warn!(offset_secs, "clock shifted for testing");
        }
        Self { offset_secs }
    }

    /// Now, in Unix seconds.
    pub fn now(&self) -> i64 {
        let since = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        since + self.offset_secs
    }
}
