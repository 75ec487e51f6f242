//! The first pass over a frame: its msgpack shape, checked without
//! allocating, so hostile frames are refused before a value tree is built.

use rankd_client::protocol::MAX_SET_MANY;

use super::MAX_DEPTH;
use crate::error::Error;

/// Most msgpack values (at any depth) a request may hold: a full `set_many`
/// is 3 per entry plus a few fields, or 11 per entry with 4-field scores. Decoding allocates per value (tiny
/// maps cost many times their size in a value tree: see
/// docs/performance-history.md), so this bounds the memory one frame can
/// cost to a few MB whatever its shape.
pub(super) const MAX_VALUES: usize = 11 * MAX_SET_MANY + 256;

/// Walks the msgpack structure without allocating: refuses frames that are
/// truncated, nest deeper than [`MAX_DEPTH`], or hold more than
/// [`MAX_VALUES`] values, before any value tree is built.
pub(super) fn check_shape(mut buf: &[u8]) -> Result<(), Error> {
    use rmp::Marker;
    let bad = |what: &str| Error::BadFrame(format!("not a msgpack value: {what}"));
    // Values still to read in each open container, innermost last: a fixed
    // stack (depth is bounded), so checking a frame allocates nothing.
    let mut open = [0u64; MAX_DEPTH + 2];
    open[0] = 1;
    let mut depth = 1;
    let mut seen = 0usize;
    while depth > 0 {
        let left = &mut open[depth - 1];
        if *left == 0 {
            depth -= 1;
            continue;
        }
        *left -= 1;
        seen += 1;
        if seen > MAX_VALUES {
            return Err(Error::TooLarge(format!("a request may hold at most {MAX_VALUES} msgpack values")));
        }
        let marker = rmp::decode::read_marker(&mut buf).map_err(|_| bad("truncated"))?;
        let mut len = |bytes: usize| -> Result<u64, Error> {
            let (head, rest) = buf.split_at_checked(bytes).ok_or_else(|| bad("truncated"))?;
            buf = rest;
            Ok(head.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
        };
        let (skip, children) = match marker {
            Marker::FixPos(_) | Marker::FixNeg(_) | Marker::Null | Marker::True | Marker::False => (0, 0),
            Marker::U8 | Marker::I8 => (1, 0),
            Marker::U16 | Marker::I16 => (2, 0),
            Marker::U32 | Marker::I32 | Marker::F32 => (4, 0),
            Marker::U64 | Marker::I64 | Marker::F64 => (8, 0),
            Marker::FixStr(n) => (u64::from(n), 0),
            Marker::Str8 | Marker::Bin8 => (len(1)?, 0),
            Marker::Str16 | Marker::Bin16 => (len(2)?, 0),
            Marker::Str32 | Marker::Bin32 => (len(4)?, 0),
            Marker::FixExt1 => (2, 0),
            Marker::FixExt2 => (3, 0),
            Marker::FixExt4 => (5, 0),
            Marker::FixExt8 => (9, 0),
            Marker::FixExt16 => (17, 0),
            Marker::Ext8 => (len(1)? + 1, 0),
            Marker::Ext16 => (len(2)? + 1, 0),
            Marker::Ext32 => (len(4)? + 1, 0),
            Marker::FixArray(n) => (0, u64::from(n)),
            Marker::Array16 => (0, len(2)?),
            Marker::Array32 => (0, len(4)?),
            Marker::FixMap(n) => (0, 2 * u64::from(n)),
            Marker::Map16 => (0, 2 * len(2)?),
            Marker::Map32 => (0, 2 * len(4)?),
            Marker::Reserved => return Err(bad("reserved marker 0xc1")),
        };
        let skip = usize::try_from(skip).map_err(|_| bad("truncated"))?;
        buf = buf.get(skip..).ok_or_else(|| bad("truncated"))?;
        if children > 0 {
            // Every value takes at least a byte: more than remain is a lie.
            if children > buf.len() as u64 {
                return Err(bad("a list or map announces more values than the frame holds"));
            }
            if depth > MAX_DEPTH {
                return Err(bad("nested too deeply"));
            }
            open[depth] = children;
            depth += 1;
        }
    }
    if !buf.is_empty() {
        return Err(Error::BadFrame("frame holds more than one msgpack value".into()));
    }
    Ok(())
}
