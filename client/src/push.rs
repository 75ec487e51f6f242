//! Pushes of watches (protocol 1.1) as a connection reads them: frames
//! `{"watch": id, "event": ...}` without an `id` key, which may arrive
//! between any two replies. [`crate::Client`] sets them aside while it waits
//! for replies, keeping only the newest of each watch, the way the server
//! itself coalesces them.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::BytesMut;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::ClientError;
use crate::protocol::MAX_WATCHES;

/// Most pushes set aside at once. One a watch, so only a connection with
/// more than this many watches pending (over several `watch`/`unwatch`
/// rounds) ever drops one: the oldest.
const MAX_BUFFERED: usize = 4 * MAX_WATCHES;

/// A push as read from the connection, its event not yet decoded (how
/// depends on what the watch follows: see [`crate::Watcher`] for typed
/// events).
#[derive(Debug, Clone)]
pub struct RawPush {
    /// The watch's id, as `watch` answered it.
    watch: u64,
    /// The whole frame's body.
    body: BytesMut,
    /// When the frame was read off the connection.
    received: Instant,
}

/// A push frame's fields, the event decoded as `T`.
#[derive(Deserialize)]
struct PushBody<T> {
    /// Absent or nil both read as `None`.
    event: Option<T>,
}

impl RawPush {
    pub(crate) fn new(watch: u64, body: BytesMut, received: Instant) -> Self {
        Self { watch, body, received }
    }

    /// The id of the watch that pushed it.
    pub fn watch(&self) -> u64 {
        self.watch
    }

    /// When this client read it off the connection (not when the caller took
    /// it: a push read while a call waited for its reply is set aside).
    pub fn received(&self) -> Instant {
        self.received
    }

    /// The frame's msgpack body, whole.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The event as a `T`: `Vec<Entry>` for a `top` watch, `RankInfo` for a
    /// `player` watch; `None` when it is nil (a player absent, or a dropped
    /// board ending the watch).
    pub fn event<T: DeserializeOwned>(&self) -> Result<Option<T>, ClientError> {
        rmp_serde::from_slice::<PushBody<T>>(&self.body)
            .map(|push| push.event)
            .map_err(|e| ClientError::Protocol(format!("push of watch {}: {e}", self.watch)))
    }
}

/// Pushes read while replies were awaited, oldest first, at most one per
/// watch.
#[derive(Debug, Default)]
pub(crate) struct PushBuffer {
    /// In the order read.
    queue: VecDeque<RawPush>,
    /// Pushes replaced by a newer one of their watch, or dropped.
    coalesced: u64,
}

impl PushBuffer {
    /// Sets `push` aside, replacing an older one of its watch: a watch's
    /// pushes each carry its whole state, so only the newest matters.
    pub fn add(&mut self, push: RawPush) {
        if let Some(at) = self.queue.iter().position(|old| old.watch == push.watch) {
            self.queue.remove(at);
            self.coalesced += 1;
        } else if self.queue.len() >= MAX_BUFFERED {
            self.queue.pop_front();
            self.coalesced += 1;
        }
        self.queue.push_back(push);
    }

    /// The oldest push set aside.
    pub fn pop(&mut self) -> Option<RawPush> {
        self.queue.pop_front()
    }

    /// Pushes set aside.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Pushes replaced or dropped so far.
    pub fn coalesced(&self) -> u64 {
        self.coalesced
    }

    /// Forgets the pushes of `watch` (once it has ended).
    pub fn discard(&mut self, watch: u64) {
        self.queue.retain(|push| push.watch != watch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply::Entry;

    fn push(watch: u64, event: Option<Vec<Entry>>) -> RawPush {
        #[derive(serde::Serialize)]
        struct Frame {
            watch: u64,
            event: Option<Vec<Entry>>,
        }
        let body = rmp_serde::to_vec_named(&Frame { watch, event }).unwrap();
        RawPush::new(watch, BytesMut::from(&body[..]), Instant::now())
    }

    fn entry(player: &str, score: i64) -> Entry {
        Entry { player: player.into(), score, rank: 1 }
    }

    #[test]
    fn keeps_the_newest_push_of_each_watch() {
        let mut buffer = PushBuffer::default();
        buffer.add(push(1, Some(vec![entry("a", 1)])));
        buffer.add(push(2, None));
        buffer.add(push(1, Some(vec![entry("a", 2)])));
        assert_eq!((buffer.len(), buffer.coalesced()), (2, 1));
        let first = buffer.pop().unwrap();
        assert_eq!(first.watch(), 2);
        assert_eq!(first.event::<Vec<Entry>>().unwrap(), None);
        let second = buffer.pop().unwrap();
        assert_eq!(second.event::<Vec<Entry>>().unwrap(), Some(vec![entry("a", 2)]));
        assert!(second.event::<u64>().is_err(), "a list is not a number");
        assert!(buffer.pop().is_none());
    }

    #[test]
    fn is_bounded_and_forgets_ended_watches() {
        let mut buffer = PushBuffer::default();
        for watch in 0..MAX_BUFFERED as u64 + 3 {
            buffer.add(push(watch, None));
        }
        assert_eq!((buffer.len(), buffer.coalesced()), (MAX_BUFFERED, 3));
        assert_eq!(buffer.pop().unwrap().watch(), 3, "the oldest went first");
        buffer.discard(4);
        assert_eq!(buffer.pop().unwrap().watch(), 5);
    }
}
