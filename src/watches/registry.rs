//! Every open watch and what it last pushed, as a plain struct: which
//! watches are due for a look (their board changed, or their period rolled
//! over, and their interval has passed), how they group into reads, and
//! whether a value read is new. The hub locks it; nothing here waits or
//! does I/O. A look visits only the watches that may be due (of a board
//! changed since, new, retried, or whose interval has passed), not every
//! watch: with many boards watched, the evaluator's lock is held for what
//! changed (when a quarter of all may be due, it walks the whole table,
//! which is then cheaper).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use rankd_shards::window::period_of;

use super::pushes::{PushBox, Put};
use super::watched::{BoardChanges, WatchedBoards};
use crate::protocol::request::{WatchSpec, WatchTarget};
use crate::protocol::View;

/// Seconds in a day: every window's periods start at a UTC midnight
/// (`rankd_shards::window`), so no period changes between two.
const DAY: i64 = 86_400;

/// A watch, server-wide: its connection and its id there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchKey {
    /// The connection, numbered by the hub.
    pub conn: u64,
    /// The id the connection gave it.
    pub watch: u64,
}

#[derive(Debug)]
struct Watch {
    spec: WatchSpec,
    pushes: Arc<PushBox>,
    /// The encoded event last pushed: what the client has once the push
    /// waiting for it, if any, is written. `None` before the first.
    last: Option<Vec<u8>>,
    /// The board's change count when the watch was last taken for a look
    /// (`None`: never, or the look must be retried). Different from the
    /// board's: the watch is due a look.
    seen: Option<u64>,
    /// The earliest its next push may go.
    next_push: Instant,
    /// Its board's change count, shared by the board's watches.
    changes: Arc<BoardChanges>,
    /// The last [`Registry::take_due`] (numbered) that met it.
    met: u64,
}

/// The watches of one board.
#[derive(Debug)]
struct BoardWatches {
    keys: BTreeSet<WatchKey>,
    /// Shared with [`WatchedBoards`], where writers bump it.
    changes: Arc<BoardChanges>,
}

/// The reads one board view needs for its due watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The board.
    pub board: String,
    /// Which window and period.
    pub view: View,
    /// The longest `top` among the watches (0: none watches a top).
    pub top: usize,
    /// The players watched, each once.
    pub players: Vec<String>,
    /// The due watches and what each follows.
    pub watches: Vec<(WatchKey, WatchTarget)>,
}

/// What became of a value read for a watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offered {
    /// New: pushed. `coalesced` when it replaced a push not yet written.
    Pushed {
        /// It replaced an unwritten push.
        coalesced: bool,
    },
    /// The same as the last push: nothing sent.
    Unchanged,
    /// Back to what the client was last written, before the push since
    /// was: that push is withdrawn and nothing is sent.
    Withdrawn,
    /// The watch ended meanwhile.
    Gone,
    /// Its board is being dropped: nothing is pushed until the drop is
    /// done (the watch ends with a nil push) or fails (it looks again).
    Withheld,
}

/// Every open watch. See the module docs.
#[derive(Debug, Default)]
pub struct Registry {
    watches: HashMap<WatchKey, Watch>,
    by_board: HashMap<String, BoardWatches>,
    /// The same boards' change counters, for writers.
    watched: Arc<WatchedBoards>,
    /// Watches due a look whatever their board's count says: new, retried,
    /// or whose period rolled over.
    due: BTreeSet<WatchKey>,
    /// Watches changed within their interval, by when it ends. An entry
    /// may be stale (the watch ended, or pushed again since): it is only a
    /// time to look again.
    waiting: BTreeSet<(Instant, WatchKey)>,
    /// How many times [`Registry::take_due`] ran.
    takes: u64,
    /// Boards whose drop is in flight, each drop with the watches open when
    /// it began, which are those it ends (a name can be dropped, made again,
    /// watched and dropped again before the first is done). A read
    /// meanwhile sees no board, a state no one acknowledged: were the drop
    /// lost in a crash, the board would be back as it was.
    dropping: HashMap<String, VecDeque<BTreeSet<WatchKey>>>,
    /// The server's clock (Unix seconds) when [`Registry::roll`] last read
    /// it: a period boundary since changes what periodic watches show.
    clock: Option<i64>,
}

impl Registry {
    /// Opens a watch; its first look is due at once.
    pub fn add(&mut self, key: WatchKey, spec: WatchSpec, pushes: Arc<PushBox>, now: Instant) {
        let watched = &self.watched;
        let board = self
            .by_board
            .entry(spec.board.clone())
            .or_insert_with(|| BoardWatches { keys: BTreeSet::new(), changes: watched.watch(&spec.board) });
        board.keys.insert(key);
        let changes = board.changes.clone();
        self.watches.insert(key, Watch { spec, pushes, last: None, seen: None, next_push: now, changes, met: 0 });
        self.due.insert(key);
    }

    /// Ends a watch; whether it was open.
    pub fn remove(&mut self, key: WatchKey) -> bool {
        self.take(key).is_some()
    }

    /// Ends `keys` (what they follow cannot be read); returns each that was
    /// open with where its last push goes.
    pub fn end(&mut self, keys: impl IntoIterator<Item = WatchKey>) -> Vec<(WatchKey, Arc<PushBox>)> {
        keys.into_iter().filter_map(|key| self.take(key).map(|watch| (key, watch.pushes))).collect()
    }

    fn take(&mut self, key: WatchKey) -> Option<Watch> {
        let watch = self.watches.remove(&key)?;
        if let Some(board) = self.by_board.get_mut(&watch.spec.board) {
            board.keys.remove(&key);
            if board.keys.is_empty() {
                self.by_board.remove(&watch.spec.board);
                self.watched.unwatch(&watch.spec.board);
            }
        }
        Some(watch)
    }

    /// Open watches.
    pub fn len(&self) -> usize {
        self.watches.len()
    }

    /// Whether no watch is open.
    pub fn is_empty(&self) -> bool {
        self.watches.is_empty()
    }

    /// The watched boards' change counters, which writers bump without
    /// this registry's lock.
    pub fn watched(&self) -> Arc<WatchedBoards> {
        self.watched.clone()
    }

    /// Makes `keys` due again (a look failed and must be retried).
    pub fn retry(&mut self, keys: impl IntoIterator<Item = WatchKey>) {
        for key in keys {
            if let Some(watch) = self.watches.get_mut(&key) {
                watch.seen = None;
                self.due.insert(key);
            }
        }
    }

    /// The server's clock reads `unix_seconds`: the watches whose period
    /// changed since it was last read are due a look, with no write (a new
    /// period starts empty; `-1` now names another). Returns when the next
    /// period may begin (Unix seconds).
    pub fn roll(&mut self, unix_seconds: i64) -> i64 {
        let before = self.clock.replace(unix_seconds);
        if let Some(before) = before.filter(|before| before.div_euclid(DAY) != unix_seconds.div_euclid(DAY)) {
            for (key, watch) in &mut self.watches {
                let rolled = match watch.spec.view.window {
                    // The board's first window, which may be periodic.
                    None => true,
                    Some(window) => period_of(window, before) != period_of(window, unix_seconds),
                };
                if rolled {
                    watch.seen = None;
                    self.due.insert(*key);
                }
            }
        }
        (unix_seconds.div_euclid(DAY) + 1) * DAY
    }

    /// Takes the watches due at `now` (changed, and past their interval),
    /// grouped by board view; and when the next one not yet due will be.
    /// Visits only the watches that may be due (see the module docs); when
    /// they are many of all, every watch in table order, which is faster
    /// than looking each up.
    pub fn take_due(&mut self, now: Instant) -> (Vec<Group>, Option<Instant>) {
        self.takes += 1;
        let take = self.takes;
        let changed = self.watched.take_changed();
        let boards: Vec<&BoardWatches> = changed.iter().filter_map(|c| self.by_board.get(&*c.name)).collect();
        let maybe_due = self.due.len() + boards.iter().map(|board| board.keys.len()).sum::<usize>();
        let mut groups = Groups::default();
        if maybe_due.saturating_mul(4) >= self.watches.len() {
            self.due.clear();
            let last = WatchKey { conn: u64::MAX, watch: u64::MAX };
            self.waiting = self.waiting.split_off(&(now, last));
            for (key, watch) in &mut self.watches {
                consider(*key, watch, now, take, &mut self.waiting, &mut groups);
            }
        } else {
            let mut maybe: Vec<WatchKey> = std::mem::take(&mut self.due).into_iter().collect();
            maybe.extend(boards.iter().flat_map(|board| board.keys.iter().copied()));
            while let Some(&(at, key)) = self.waiting.first() {
                if at > now {
                    break;
                }
                self.waiting.pop_first();
                maybe.push(key);
            }
            for key in maybe {
                if let Some(watch) = self.watches.get_mut(&key) {
                    consider(key, watch, now, take, &mut self.waiting, &mut groups);
                }
            }
        }
        let mut groups = groups.groups;
        groups.sort_unstable_by(|a, b| {
            (&a.board, a.view.window.map(|w| w.code()), a.view.period).cmp(&(
                &b.board,
                b.view.window.map(|w| w.code()),
                b.view.period,
            ))
        });
        for group in &mut groups {
            // Each player read once, however many watch them.
            group.players.sort_unstable();
            group.players.dedup();
        }
        (groups, self.waiting.first().map(|&(at, _)| at))
    }

    /// Offers a value read for `key` (`frame` frames `event` for the
    /// connection): pushed if it differs from the last push, and then the
    /// watch's next push waits out its interval. A value back to what the
    /// client was last written withdraws the push not yet written since.
    pub fn offer(&mut self, key: WatchKey, event: &[u8], frame: impl FnOnce() -> Vec<u8>, now: Instant) -> Offered {
        let Some(watch) = self.watches.get_mut(&key) else { return Offered::Gone };
        if self.dropping.contains_key(&watch.spec.board) {
            return Offered::Withheld;
        }
        if watch.last.as_deref() == Some(event) {
            return Offered::Unchanged;
        }
        watch.last = Some(event.to_vec());
        watch.next_push = now + watch.spec.interval;
        match watch.pushes.put(key.watch, frame(), false) {
            Put::Waiting => Offered::Pushed { coalesced: false },
            Put::Coalesced => Offered::Pushed { coalesced: true },
            Put::Withdrawn => Offered::Withdrawn,
        }
    }

    /// A drop of `board` has begun: its watches push nothing until it ends
    /// ([`Registry::dropped`] or [`Registry::drop_failed`]).
    pub fn dropping(&mut self, board: &str) {
        let open = self.by_board.get(board).map(|watches| watches.keys.clone()).unwrap_or_default();
        self.dropping.entry(board.to_owned()).or_default().push_back(open);
    }

    /// Ends the watches of `board` that were open when its drop began (all
    /// of them if none was recorded); returns each with where its last push
    /// goes. Those opened since follow the board made again under the name,
    /// and look at it now.
    pub fn dropped(&mut self, board: &str) -> Vec<(WatchKey, Arc<PushBox>)> {
        let ended = match self.drop_ended(board) {
            Some(open) => open,
            None => self.by_board.get(board).map(|watches| watches.keys.clone()).unwrap_or_default(),
        };
        let ended = self.end(ended);
        self.retry_board(board);
        ended
    }

    /// A drop of `board` failed: its watches look again, at what reads
    /// answer now.
    pub fn drop_failed(&mut self, board: &str) {
        self.drop_ended(board);
        self.retry_board(board);
    }

    fn retry_board(&mut self, board: &str) {
        let keys: Vec<WatchKey> =
            self.by_board.get(board).map(|b| b.keys.iter().copied().collect()).unwrap_or_default();
        self.retry(keys);
    }

    /// The watches open when the oldest drop of `board` in flight began.
    fn drop_ended(&mut self, board: &str) -> Option<BTreeSet<WatchKey>> {
        let drops = self.dropping.get_mut(board)?;
        let open = drops.pop_front();
        if drops.is_empty() {
            self.dropping.remove(board);
        }
        open
    }
}

/// A board view, named by its board's counter (not its name, which would
/// be hashed once per watch).
type ViewKey = (*const BoardChanges, Option<u8>, i64);

/// Due watches grouped by board view. Watches come in runs of one view
/// (one board's, or a table where most are of one board), so the last
/// group is tried before the map.
#[derive(Default)]
struct Groups {
    groups: Vec<Group>,
    index: HashMap<ViewKey, usize>,
    last: Option<(ViewKey, usize)>,
}

impl Groups {
    /// The group of view `key`, made with `make` if it is the first.
    fn of(&mut self, key: ViewKey, make: impl FnOnce() -> Group) -> &mut Group {
        let at = match self.last {
            Some((last, at)) if last == key => at,
            _ => {
                let at = *self.index.entry(key).or_insert_with(|| {
                    self.groups.push(make());
                    self.groups.len() - 1
                });
                self.last = Some((key, at));
                at
            }
        };
        &mut self.groups[at]
    }
}

/// Takes `watch` into its group if it is due at `now`, or has it wait out
/// its interval. A watch met twice in one take (new, and its board
/// changed) is taken once.
fn consider(
    key: WatchKey,
    watch: &mut Watch,
    now: Instant,
    take: u64,
    waiting: &mut BTreeSet<(Instant, WatchKey)>,
    groups: &mut Groups,
) {
    let Watch { spec, seen, next_push, changes, met, .. } = watch;
    if std::mem::replace(met, take) == take {
        return;
    }
    let count = changes.count();
    if *seen == Some(count) {
        return;
    }
    if *next_push > now {
        waiting.insert((*next_push, key));
        return;
    }
    *seen = Some(count);
    let view = spec.view;
    let group = groups.of((Arc::as_ptr(changes), view.window.map(|w| w.code()), view.period), || Group {
        board: spec.board.clone(),
        view,
        top: 0,
        players: Vec::new(),
        watches: Vec::new(),
    });
    match &spec.target {
        WatchTarget::Top(n) => group.top = group.top.max(*n),
        WatchTarget::Player(player) => group.players.push(player.clone()),
    }
    group.watches.push((key, spec.target.clone()));
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::watches::pushes::Taken;

    fn spec(board: &str, target: WatchTarget, interval_ms: u64) -> WatchSpec {
        WatchSpec { board: board.into(), target, view: View::default(), interval: Duration::from_millis(interval_ms) }
    }

    fn key(conn: u64, watch: u64) -> WatchKey {
        WatchKey { conn, watch }
    }

    #[test]
    fn a_new_watch_is_due_at_once_and_groups_by_board() {
        let (mut registry, now, pushes) = (Registry::default(), Instant::now(), Arc::new(PushBox::default()));
        registry.add(key(1, 1), spec("b", WatchTarget::Top(5), 100), pushes.clone(), now);
        registry.add(key(1, 2), spec("b", WatchTarget::Top(10), 100), pushes.clone(), now);
        registry.add(key(2, 1), spec("b", WatchTarget::Player("p".into()), 100), pushes.clone(), now);
        registry.add(key(2, 2), spec("b", WatchTarget::Player("p".into()), 100), pushes.clone(), now);
        registry.add(key(3, 1), spec("c", WatchTarget::Top(1), 100), pushes, now);
        let (groups, next) = registry.take_due(now);
        assert_eq!(next, None);
        assert_eq!(groups.len(), 2);
        assert_eq!((groups[0].board.as_str(), groups[0].top, groups[0].players.clone()), ("b", 10, vec!["p".into()]));
        assert_eq!(groups[0].watches.len(), 4);
        assert!(registry.take_due(now).0.is_empty(), "taken: not due again until changed");
    }

    #[test]
    fn pushes_only_new_values_and_at_most_once_per_interval() {
        let (mut registry, t0, pushes) = (Registry::default(), Instant::now(), Arc::new(PushBox::default()));
        let k = key(1, 7);
        registry.add(k, spec("b", WatchTarget::Top(3), 100), pushes.clone(), t0);
        registry.take_due(t0);
        assert_eq!(registry.offer(k, b"v1", || b"f1".to_vec(), t0), Offered::Pushed { coalesced: false });
        // Changed 10 ms later: due only once the interval has passed.
        registry.watched().changed("b");
        let (groups, next) = registry.take_due(t0 + Duration::from_millis(10));
        assert!(groups.is_empty());
        assert_eq!(next, Some(t0 + Duration::from_millis(100)));
        let (groups, _) = registry.take_due(t0 + Duration::from_millis(100));
        assert_eq!(groups.len(), 1);
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(registry.offer(k, b"v1", || b"f1".to_vec(), t1), Offered::Unchanged);
        // Not read by the client yet: the new push replaces the old one.
        assert_eq!(registry.offer(k, b"v2", || b"f2".to_vec(), t1), Offered::Pushed { coalesced: true });
        assert_eq!(pushes.take(|_| true).bytes, b"f2");
        // Another board's writes do not touch it.
        registry.watched().changed("other");
        assert!(registry.take_due(t1 + Duration::from_secs(1)).0.is_empty());
    }

    /// A watch changed within its interval is looked at when the interval
    /// ends, with no further write; one that ended meanwhile is not.
    #[test]
    fn a_watch_changed_within_its_interval_is_due_when_it_ends() {
        let (mut registry, t0, pushes) = (Registry::default(), Instant::now(), Arc::new(PushBox::default()));
        let ms = |n| t0 + Duration::from_millis(n);
        let (k, gone) = (key(1, 1), key(2, 1));
        registry.add(k, spec("b", WatchTarget::Top(3), 100), pushes.clone(), t0);
        registry.add(gone, spec("c", WatchTarget::Top(3), 100), pushes.clone(), t0);
        assert_eq!(registry.take_due(t0).0.len(), 2);
        registry.offer(k, b"v1", || b"f1".to_vec(), t0);
        registry.offer(gone, b"v1", || b"f1".to_vec(), t0);
        registry.watched().changed("b");
        registry.watched().changed("c");
        assert_eq!(registry.take_due(ms(10)), (Vec::new(), Some(ms(100))));
        assert!(registry.remove(gone));
        let (groups, next) = registry.take_due(ms(100));
        assert_eq!(groups.iter().map(|g| g.board.as_str()).collect::<Vec<_>>(), ["b"]);
        assert_eq!(next, None);
        // Pushed again at 100 ms: a change at 150 waits until 200.
        registry.offer(k, b"v2", || b"f2".to_vec(), ms(100));
        registry.watched().changed("b");
        assert_eq!(registry.take_due(ms(150)), (Vec::new(), Some(ms(200))));
        assert!(registry.take_due(ms(199)).0.is_empty());
        assert_eq!(registry.take_due(ms(200)).0.len(), 1);
        assert_eq!(registry.take_due(ms(300)), (Vec::new(), None), "nothing changed since");
    }

    /// A push replaced before it was written never reached the client: a
    /// value equal to the one the client last got is not sent again.
    #[test]
    fn a_value_the_client_has_is_not_pushed_again_after_an_unwritten_one() {
        let (mut registry, now, pushes) = (Registry::default(), Instant::now(), Arc::new(PushBox::default()));
        let k = key(1, 1);
        registry.add(k, spec("b", WatchTarget::Top(3), 10), pushes.clone(), now);
        assert_eq!(registry.offer(k, b"v1", || b"f1".to_vec(), now), Offered::Pushed { coalesced: false });
        assert_eq!(pushes.take(|_| true).bytes, b"f1", "written");
        assert_eq!(registry.offer(k, b"v2", || b"f2".to_vec(), now), Offered::Pushed { coalesced: false });
        // Back to v1 before f2 was written: the client still has v1.
        assert_eq!(registry.offer(k, b"v1", || b"f1".to_vec(), now), Offered::Withdrawn);
        assert_eq!(pushes.take(|_| true), Taken::default(), "v1 twice in a row");
        assert_eq!(registry.offer(k, b"v1", || b"f1".to_vec(), now), Offered::Unchanged);
        // And v2 again is new to the client.
        assert_eq!(registry.offer(k, b"v2", || b"f2".to_vec(), now), Offered::Pushed { coalesced: false });
        assert_eq!(pushes.take(|_| true).bytes, b"f2");
    }

    /// A period boundary makes due, with no write, the watches whose view
    /// names a periodic window's period, or the board's first window.
    #[test]
    fn a_period_boundary_makes_periodic_watches_due() {
        use rankd_shards::Window;
        let (mut registry, now, pushes) = (Registry::default(), Instant::now(), Arc::new(PushBox::default()));
        let with = |window, period| WatchSpec { view: View { window, period }, ..spec("b", WatchTarget::Top(3), 10) };
        // Sunday 2026-05-31, a second before midnight: the next day is a
        // Monday and the first of a month.
        let sunday = 1_780_272_000 - 1;
        registry.add(key(1, 1), with(Some(Window::Daily), 0), pushes.clone(), now);
        registry.add(key(1, 2), with(Some(Window::Weekly), -1), pushes.clone(), now);
        registry.add(key(1, 3), with(None, 0), pushes.clone(), now);
        registry.add(key(1, 4), with(Some(Window::All), 0), pushes.clone(), now);
        registry.add(key(1, 5), with(Some(Window::Monthly), 0), pushes, now);
        assert_eq!(registry.roll(sunday - 3600), sunday + 1, "the next midnight");
        registry.take_due(now);
        assert_eq!(registry.roll(sunday), sunday + 1);
        assert!(registry.take_due(now).0.is_empty(), "the same day: nothing rolled");
        let due = |registry: &mut Registry| {
            let mut keys: Vec<u64> =
                registry.take_due(now).0.iter().flat_map(|g| g.watches.iter().map(|(k, _)| k.watch)).collect();
            keys.sort_unstable();
            keys
        };
        assert_eq!(registry.roll(sunday + 1), sunday + 1 + DAY);
        assert_eq!(due(&mut registry), [1, 2, 3, 5], "all but the all-time window");
        // Monday to Tuesday: a new day only (the first window may be daily).
        assert_eq!(registry.roll(sunday + 1 + DAY), sunday + 1 + 2 * DAY);
        assert_eq!(due(&mut registry), [1, 3]);
    }

    #[test]
    fn ended_watches_leave_their_board_unwatched_once_none_is_left() {
        let (mut registry, now, pushes) = (Registry::default(), Instant::now(), Arc::new(PushBox::default()));
        registry.add(key(1, 1), spec("b", WatchTarget::Top(3), 100), pushes.clone(), now);
        registry.add(key(1, 2), spec("b", WatchTarget::Player("p".into()), 100), pushes.clone(), now);
        registry.add(key(2, 1), spec("c", WatchTarget::Top(3), 100), pushes, now);
        let ended = registry.end([key(1, 1), key(9, 9)]);
        assert_eq!(ended.iter().map(|(k, _)| *k).collect::<Vec<_>>(), [key(1, 1)], "an unknown key ends nothing");
        assert!(registry.watched().contains("b"), "one watch of b is left");
        assert_eq!(registry.end([key(1, 2)]).len(), 1);
        assert!(!registry.watched().contains("b") && registry.watched().contains("c"));
        assert_eq!(registry.len(), 1);
        assert!(!registry.remove(key(1, 2)), "already ended");
    }

    /// Between a drop's start and its end, a read sees no board, which
    /// no one acknowledged: nothing is pushed. A failed drop looks again.
    #[test]
    fn a_board_being_dropped_pushes_nothing_until_the_drop_ends() {
        let (mut registry, now, pushes) = (Registry::default(), Instant::now(), Arc::new(PushBox::default()));
        let (k, other) = (key(1, 1), key(1, 2));
        registry.add(k, spec("b", WatchTarget::Top(3), 10), pushes.clone(), now);
        registry.add(other, spec("c", WatchTarget::Top(3), 10), pushes.clone(), now);
        registry.take_due(now);
        assert_eq!(registry.offer(k, b"alice", || b"f1".to_vec(), now), Offered::Pushed { coalesced: false });
        pushes.take(|_| true);
        // A look taken before the drop answers after it began.
        registry.watched().changed("b");
        let later = now + Duration::from_millis(10);
        assert_eq!(registry.take_due(later).0.len(), 1);
        registry.dropping("b");
        assert_eq!(registry.offer(k, b"[]", || b"f2".to_vec(), later), Offered::Withheld);
        assert_eq!(registry.offer(other, b"[]", || b"f3".to_vec(), later), Offered::Pushed { coalesced: false });
        assert_eq!(pushes.take(|_| true).bytes, b"f3", "only the other board's");
        // Failed: due again, and what reads answer now is pushed.
        registry.drop_failed("b");
        let groups = registry.take_due(later).0;
        assert_eq!(groups.iter().map(|g| g.board.as_str()).collect::<Vec<_>>(), vec!["b"]);
        assert_eq!(registry.offer(k, b"[]", || b"f2".to_vec(), later), Offered::Pushed { coalesced: false });
        assert_eq!(pushes.take(|_| true).bytes, b"f2");
        // Dropped twice over (made again meanwhile): withheld until both end.
        registry.dropping("b");
        registry.dropping("b");
        assert_eq!(registry.dropped("b").len(), 1);
        registry.add(k, spec("b", WatchTarget::Top(3), 10), pushes.clone(), later);
        registry.take_due(later);
        assert_eq!(registry.offer(k, b"v", || b"f4".to_vec(), later), Offered::Withheld);
        registry.drop_failed("b");
        assert_eq!(registry.offer(k, b"v", || b"f4".to_vec(), later), Offered::Pushed { coalesced: false });
    }

    /// A board dropped and made again under its name before the drop is
    /// done: a watch opened on the new one is not ended by the old one's
    /// drop, and looks once it is done.
    #[test]
    fn a_drop_ends_only_the_watches_open_when_it_began() {
        let (mut registry, now, pushes) = (Registry::default(), Instant::now(), Arc::new(PushBox::default()));
        let (old, new) = (key(1, 1), key(2, 1));
        registry.add(old, spec("b", WatchTarget::Top(3), 10), pushes.clone(), now);
        registry.take_due(now);
        registry.dropping("b");
        registry.add(new, spec("b", WatchTarget::Top(3), 10), pushes.clone(), now);
        let due = registry.take_due(now).0;
        assert_eq!(due.iter().flat_map(|g| g.watches.iter().map(|(k, _)| *k)).collect::<Vec<_>>(), vec![new]);
        assert_eq!(registry.offer(new, b"[bob]", || b"f".to_vec(), now), Offered::Withheld, "the drop is in flight");
        let ended: Vec<WatchKey> = registry.dropped("b").into_iter().map(|(k, _)| k).collect();
        assert_eq!(ended, vec![old], "only the watch of the dropped board");
        assert!(registry.watched().contains("b"));
        let due = registry.take_due(now).0;
        assert_eq!(due.iter().flat_map(|g| g.watches.iter().map(|(k, _)| *k)).collect::<Vec<_>>(), vec![new]);
        assert_eq!(registry.offer(new, b"[bob]", || b"f".to_vec(), now), Offered::Pushed { coalesced: false });
    }

    #[test]
    fn ended_watches_take_no_more_pushes() {
        let (mut registry, now, pushes) = (Registry::default(), Instant::now(), Arc::new(PushBox::default()));
        registry.add(key(1, 1), spec("b", WatchTarget::Top(3), 10), pushes.clone(), now);
        registry.add(key(1, 2), spec("b", WatchTarget::Top(3), 10), pushes.clone(), now);
        registry.add(key(1, 3), spec("c", WatchTarget::Top(3), 10), pushes, now);
        assert!(registry.remove(key(1, 1)));
        assert!(!registry.remove(key(1, 1)));
        assert_eq!(registry.offer(key(1, 1), b"v", Vec::new, now), Offered::Gone);
        let dropped = registry.dropped("b");
        assert_eq!(dropped.iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![key(1, 2)]);
        assert!(!registry.watched().contains("b") && registry.watched().contains("c"));
        assert_eq!(registry.len(), 1);
    }
}
