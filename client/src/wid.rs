//! Write ids (`wid`, protocol 1.1) that never repeat: a random 64-bit
//! prefix per source, from the operating system's generator, and a 64-bit
//! sequence number, written as 32 hex digits.

use std::fmt::Write as _;

/// Makes `wid`s: each source draws a random 64-bit prefix once, then
/// numbers its wids, so two wids of one source never repeat and two sources
/// share a prefix with probability about 2^-64 per pair.
#[derive(Debug, Clone)]
pub struct WidSource {
    /// This source's random half of every wid.
    prefix: u64,
    /// The number of the next wid.
    next: u64,
}

impl Default for WidSource {
    fn default() -> Self {
        Self::new()
    }
}

impl WidSource {
    /// A source with a fresh random prefix.
    pub fn new() -> Self {
        let mut bytes = [0u8; 8];
        if getrandom::getrandom(&mut bytes).is_err() {
            // No OS generator (never on the platforms rankd runs on): the
            // clock, the process and this value's address still differ
            // between sources.
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let seed = now.as_nanos() as u64 ^ (u64::from(std::process::id()) << 32) ^ (&bytes as *const _ as u64);
            bytes = splitmix64(seed).to_le_bytes();
        }
        Self::with_prefix(u64::from_le_bytes(bytes))
    }

    /// A source with a chosen prefix (tests, or ids that must be
    /// reproducible): two sources with one prefix make the same wids.
    pub fn with_prefix(prefix: u64) -> Self {
        Self { prefix, next: 0 }
    }

    /// This source's random half of every wid: also a fresh random id for
    /// whatever else must not repeat (an import's run).
    pub fn prefix(&self) -> u64 {
        self.prefix
    }

    /// The next wid: 32 lowercase hex digits.
    pub fn next_wid(&mut self) -> String {
        let mut wid = String::with_capacity(32);
        self.write_next(&mut wid);
        wid
    }

    /// Appends the next wid to `out` (no allocation when it has room).
    pub fn write_next(&mut self, out: &mut String) {
        let _ = write!(out, "{:016x}{:016x}", self.prefix, self.next);
        self.next = self.next.wrapping_add(1);
    }
}

/// One step of SplitMix64: spreads a seed's bits over the whole word.
fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::MAX_WID;

    #[test]
    fn wids_are_hex_within_the_limit_and_never_repeat() {
        let mut source = WidSource::with_prefix(0xabc);
        assert_eq!(source.next_wid(), "0000000000000abc0000000000000000");
        assert_eq!(source.next_wid(), "0000000000000abc0000000000000001");
        let (mut a, mut b) = (WidSource::new(), WidSource::new());
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            for wid in [a.next_wid(), b.next_wid()] {
                assert!(wid.len() == 32 && wid.len() <= MAX_WID && wid.bytes().all(|c| c.is_ascii_hexdigit()));
                assert!(seen.insert(wid), "a wid repeated");
            }
        }
        assert_ne!(splitmix64(1), splitmix64(2));
    }
}
