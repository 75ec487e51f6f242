//! One connection's pushes waiting to be written: the latest frame of each
//! watch, never a backlog, so a client that reads slowly costs at most one
//! frame per watch and gets the latest state when it reads again.

use std::collections::{BTreeMap, BTreeSet};

use parking_lot::Mutex;
use tokio::sync::Notify;

/// A connection's waiting pushes. The evaluator puts, the connection takes.
#[derive(Debug, Default)]
pub struct PushBox {
    state: Mutex<Waiting>,
    /// Wakes the connection when something was put.
    ready: Notify,
}

#[derive(Debug, Default)]
struct Waiting {
    /// The framed push of each watch, by watch id.
    frames: BTreeMap<u64, Vec<u8>>,
    /// Watches whose last push is in `frames` (their board was dropped).
    ended: BTreeSet<u64>,
}

/// What [`PushBox::take`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Taken {
    /// The frames, concatenated, in watch order.
    pub bytes: Vec<u8>,
    /// How many frames.
    pub frames: usize,
    /// Watches that ended with these frames.
    pub ended: Vec<u64>,
}

impl PushBox {
    /// Puts `frame` for `watch`, replacing one not yet written; returns
    /// whether it replaced one (the two pushes coalesced). `last` ends the
    /// watch once written.
    pub fn put(&self, watch: u64, frame: Vec<u8>, last: bool) -> bool {
        let replaced = {
            let mut state = self.state.lock();
            if last {
                state.ended.insert(watch);
            }
            state.frames.insert(watch, frame).is_some()
        };
        self.ready.notify_one();
        replaced
    }

    /// Takes the frames of the watches `announced` allows (those whose
    /// `watch` response is written), leaving the others.
    pub fn take(&self, announced: impl Fn(u64) -> bool) -> Taken {
        let mut state = self.state.lock();
        let mut taken = Taken::default();
        let Waiting { frames, ended } = &mut *state;
        frames.retain(|watch, frame| {
            if !announced(*watch) {
                return true;
            }
            taken.bytes.extend_from_slice(frame);
            taken.frames += 1;
            if ended.remove(watch) {
                taken.ended.push(*watch);
            }
            false
        });
        taken
    }

    /// Drops whatever waits for `watch` (it was unwatched).
    pub fn forget(&self, watch: u64) {
        let mut state = self.state.lock();
        state.frames.remove(&watch);
        state.ended.remove(&watch);
    }

    /// Resolves once something was put since the last time it resolved.
    pub async fn ready(&self) {
        self.ready.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_keeps_only_its_latest_frame_until_announced() {
        let pushes = PushBox::default();
        assert!(!pushes.put(1, b"a".to_vec(), false));
        assert!(pushes.put(1, b"b".to_vec(), false), "coalesced");
        pushes.put(2, b"c".to_vec(), false);
        let taken = pushes.take(|watch| watch == 2);
        assert_eq!((taken.bytes.as_slice(), taken.frames), (&b"c"[..], 1));
        let taken = pushes.take(|_| true);
        assert_eq!(taken.bytes, b"b");
        assert_eq!(pushes.take(|_| true), Taken::default());
    }

    #[test]
    fn a_last_frame_ends_its_watch_and_forgetting_drops_it() {
        let pushes = PushBox::default();
        pushes.put(3, b"x".to_vec(), false);
        pushes.put(3, b"nil".to_vec(), true);
        pushes.put(4, b"y".to_vec(), false);
        pushes.forget(4);
        let taken = pushes.take(|_| true);
        assert_eq!((taken.bytes, taken.ended), (b"nil".to_vec(), vec![3]));
    }
}
