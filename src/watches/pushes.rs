//! One connection's pushes waiting to be written: the latest frame of each
//! watch, never a backlog, so a client that reads slowly costs at most two
//! frames per watch (the one waiting, and the one it was last written) and
//! gets the latest state when it reads again.

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
    /// The frame each watch last had taken to be written: what its client
    /// has, which a waiting frame replaced by an equal one must not repeat.
    sent: BTreeMap<u64, Vec<u8>>,
}

/// What [`PushBox::put`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// The frame waits; none did before.
    Waiting,
    /// The frame replaced one not yet written (the two pushes coalesced).
    Coalesced,
    /// The frame equals the one last written, and one not yet written was
    /// waiting: that one is withdrawn and nothing waits, so the client,
    /// which has this frame already, is not sent it twice in a row.
    Withdrawn,
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
    /// Puts `frame` for `watch`, replacing one not yet written, or
    /// withdrawing it if `frame` is what was last written (see [`Put`]).
    /// `last` ends the watch once written; such a frame is always put.
    pub fn put(&self, watch: u64, frame: Vec<u8>, last: bool) -> Put {
        let put = {
            let mut state = self.state.lock();
            let Waiting { frames, ended, sent } = &mut *state;
            let waiting = frames.contains_key(&watch);
            if waiting && !last && !ended.contains(&watch) && sent.get(&watch) == Some(&frame) {
                frames.remove(&watch);
                return Put::Withdrawn;
            }
            if last {
                ended.insert(watch);
            }
            match frames.insert(watch, frame) {
                Some(_) => Put::Coalesced,
                None => Put::Waiting,
            }
        };
        self.ready.notify_one();
        put
    }

    /// Takes the frames of the watches `announced` allows (those whose
    /// `watch` response is written), leaving the others.
    pub fn take(&self, announced: impl Fn(u64) -> bool) -> Taken {
        let mut state = self.state.lock();
        let mut taken = Taken::default();
        let Waiting { frames, ended, sent } = &mut *state;
        frames.retain(|watch, frame| {
            if !announced(*watch) {
                return true;
            }
            taken.bytes.extend_from_slice(frame);
            taken.frames += 1;
            if ended.remove(watch) {
                taken.ended.push(*watch);
                sent.remove(watch);
            } else {
                sent.insert(*watch, std::mem::take(frame));
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
        state.sent.remove(&watch);
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
        assert_eq!(pushes.put(1, b"a".to_vec(), false), Put::Waiting);
        assert_eq!(pushes.put(1, b"b".to_vec(), false), Put::Coalesced);
        pushes.put(2, b"c".to_vec(), false);
        let taken = pushes.take(|watch| watch == 2);
        assert_eq!((taken.bytes.as_slice(), taken.frames), (&b"c"[..], 1));
        let taken = pushes.take(|_| true);
        assert_eq!(taken.bytes, b"b");
        assert_eq!(pushes.take(|_| true), Taken::default());
    }

    /// The client has what was last written: a waiting frame replaced by
    /// that same frame is withdrawn, not written twice in a row.
    #[test]
    fn a_frame_back_to_the_one_written_withdraws_the_waiting_one() {
        let pushes = PushBox::default();
        pushes.put(1, b"a".to_vec(), false);
        assert_eq!(pushes.take(|_| true).bytes, b"a");
        assert_eq!(pushes.put(1, b"a".to_vec(), false), Put::Waiting, "nothing waits: put as asked");
        pushes.take(|_| true);
        pushes.put(1, b"b".to_vec(), false);
        assert_eq!(pushes.put(1, b"a".to_vec(), false), Put::Withdrawn);
        assert_eq!(pushes.take(|_| true), Taken::default());
        // A watch's last frame is put even if it equals the one written.
        pushes.put(1, b"b".to_vec(), false);
        assert_eq!(pushes.put(1, b"a".to_vec(), true), Put::Coalesced);
        let taken = pushes.take(|_| true);
        assert_eq!((taken.bytes, taken.ended), (b"a".to_vec(), vec![1]));
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
