//! The board registry and the global arrival sequence: what the router
//! decides alone, before any shard is asked.

use std::collections::HashSet;
use std::ops::Bound;

use rankd_shards::{window, Board, BoardConfig, ConfigInterner, SharedBoard, Ties, TreeId, Window};

use super::name_index::NameIndex;
use super::name_order::NameOrder;
use crate::error::Error;
use crate::protocol::View;

/// What the router recovered from the shards at start-up.
pub struct RouterState {
    /// Every live board, by name.
    boards: NameIndex,
    /// The same boards in name order.
    names: NameOrder,
    /// Highest board id ever used.
    max_board_id: u64,
    /// Highest arrival sequence ever stored.
    max_seq: u64,
}

impl RouterState {
    /// The live boards among `held` (every board the shards hold, once, in
    /// id order). A half-finished drop can leave an older board of a name
    /// in some shard: the newest id is the live one. The name order is
    /// sorted on a second thread from the boards in id order, the order
    /// their names were allocated in: a million of them sort in a fraction
    /// of the time they take in hash order. The highest board id and
    /// arrival sequence stored come with [`RouterState::with_stored_maxima`].
    pub fn from_held(held: Vec<Board>) -> Self {
        let held: Vec<SharedBoard> = held.into_iter().map(SharedBoard::new).collect();
        std::thread::scope(|scope| {
            let names = scope.spawn(|| {
                let mut live = held.clone();
                // Of one name, the newest first, and only it kept.
                live.sort_by(|a, b| a.name.cmp(&b.name).then(b.id.cmp(&a.id)));
                live.dedup_by(|later, kept| later.name == kept.name);
                NameOrder::from_sorted(live)
            });
            let boards = Self::by_name(&held);
            let names = names.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            Self { boards, names, max_board_id: 0, max_seq: 0 }
        })
    }

    /// The state with the highest board id and arrival sequence the shards
    /// stored: new ids and sequences start past them.
    pub fn with_stored_maxima(self, max_board_id: u64, max_seq: u64) -> Self {
        Self { max_board_id, max_seq, ..self }
    }

    /// The live boards of `held` by name (see [`RouterState::from_held`]).
    fn by_name(held: &[SharedBoard]) -> NameIndex {
        let mut boards = NameIndex::with_capacity(held.len());
        for board in held {
            if let Some(older) = boards.replace(board.clone()) {
                debug_assert!(older.id < board.id, "boards come in id order");
            }
        }
        boards
    }

    /// Ids of the live boards that rank `dense`.
    pub fn dense_board_ids(&self) -> HashSet<u64> {
        self.boards.iter().filter(|b| b.config.ties == Ties::Dense).map(|b| b.id).collect()
    }
}

/// Boards by name, the next board id and the next arrival sequence (the
/// reach order of `ordinal` ties, global across shards).
///
/// A board is stored once, shared by the hash set, the ordered set and
/// every request that names it; boards of one config share it.
pub struct Boards {
    by_name: NameIndex,
    /// The boards in name order, for `boards` pages: kept beside the hash
    /// set so a write's lookup stays a hash, and a page is a range, not a
    /// sort.
    names: NameOrder,
    configs: ConfigInterner,
    /// Where the number of boards is published, once given.
    gauge: Option<prometheus::IntGauge>,
    next_board_id: u64,
    next_seq: u64,
}

/// What `create_board` does with a name.
#[derive(Debug)]
pub enum Created {
    /// A new board: every shard must store its config.
    New(SharedBoard),
    /// The board exists with this config already.
    Exists,
}

impl Boards {
    /// The registry the shards' stored state describes.
    pub fn new(state: RouterState) -> Self {
        Self {
            names: state.names,
            by_name: state.boards,
            configs: ConfigInterner::default(),
            gauge: None,
            next_board_id: state.max_board_id + 1,
            next_seq: state.max_seq + 1,
        }
    }

    /// Publishes the number of boards on `gauge` from now on.
    pub fn publish_count(mut self, gauge: prometheus::IntGauge) -> Self {
        gauge.set(i64::try_from(self.by_name.len()).unwrap_or(i64::MAX));
        self.gauge = Some(gauge);
        self
    }

    fn count_changed(&self) {
        debug_assert_eq!(self.names.len(), self.by_name.len(), "both indexes hold every board");
        if let Some(gauge) = &self.gauge {
            gauge.set(i64::try_from(self.by_name.len()).unwrap_or(i64::MAX));
        }
    }

    /// Creates `name` with `config`; a board of that name with another
    /// config is a conflict.
    pub fn create(&mut self, name: &str, config: BoardConfig) -> Result<Created, Error> {
        match self.get(name) {
            Some(existing) if *existing.config == config => Ok(Created::Exists),
            Some(_) => Err(Error::Conflict(format!("board `{name}` exists with another config"))),
            None => Ok(Created::New(self.insert(name, config))),
        }
    }

    /// The board a write goes to, created with the default config if new
    /// (the shards store it with the write).
    pub fn for_write(&mut self, name: &str) -> SharedBoard {
        match self.get(name) {
            Some(board) => board.clone(),
            None => self.insert(name, BoardConfig::default()),
        }
    }

    fn insert(&mut self, name: &str, config: BoardConfig) -> SharedBoard {
        let config = self.configs.intern(config);
        let board = SharedBoard::new(Board { id: self.next_board_id, name: name.into(), config });
        self.next_board_id += 1;
        self.by_name.replace(board.clone());
        self.names.insert(board.clone());
        self.count_changed();
        board
    }

    /// The board called `name`, if any.
    pub fn get(&self, name: &str) -> Option<&SharedBoard> {
        self.by_name.get(name)
    }

    /// Asks the CPU for the boards called `names`, about to be looked up
    /// (see the `name_index` module).
    pub fn prefetch<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        self.by_name.prefetch(names);
    }

    /// Forgets `name`; the name may be reused at once (with a new id).
    pub fn remove(&mut self, name: &str) -> Option<SharedBoard> {
        self.names.remove(name);
        let removed = self.by_name.take(name);
        self.count_changed();
        removed
    }

    /// Every board, by name.
    pub fn sorted(&self) -> Vec<SharedBoard> {
        self.page("", None, usize::MAX)
    }

    /// Up to `limit` boards whose names start with `prefix`, after the name
    /// `after` if given, in byte order: one `boards` page. O(log n + limit).
    pub fn page(&self, prefix: &str, after: Option<&str>, limit: usize) -> Vec<SharedBoard> {
        let start = match after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        self.names.range_from(start).take_while(|board| board.name.starts_with(prefix)).take(limit).cloned().collect()
    }

    /// The next write's arrival sequence.
    pub fn next_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// The board and tree a read of `name` at `view` looks at, `now` (Unix
    /// seconds) deciding the periods; `None` when the board does not exist
    /// (it reads as empty, but the view must still be one some board could
    /// have).
    pub fn view(&self, name: &str, view: View, now: i64) -> Result<Option<(SharedBoard, TreeId)>, Error> {
        let Some(board) = self.get(name) else {
            if view.window == Some(Window::All) && view.period != 0 {
                return Err(Error::BadRequest("the `all` window has only period 0".into()));
            }
            return Ok(None);
        };
        let window = view.window.unwrap_or(board.config.windows[0]);
        if !board.config.windows.contains(&window) {
            return Err(Error::BadRequest(format!("board `{name}` has no `{window}` window")));
        }
        let oldest = if window == Window::All { 0 } else { -i64::from(board.config.keep) };
        if view.period < oldest {
            return Err(Error::BadRequest(format!(
                "period {} is out of range: board `{name}` keeps `{window}` periods 0 to {oldest}",
                view.period
            )));
        }
        let tree = window::tree_at(board, window, now, view.period)
            .ok_or_else(|| Error::BadRequest("period before the epoch".into()))?;
        Ok(Some((board.clone(), tree)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rankd_shards::Order;

    fn boards() -> Boards {
        let old = Board { id: 7, name: "old".into(), config: BoardConfig::default().into() };
        Boards::new(RouterState::from_held(vec![old]).with_stored_maxima(9, 41))
    }

    #[test]
    fn the_newest_board_of_a_name_is_the_live_one() {
        let board = |id, name: &str| Board { id, name: name.into(), config: BoardConfig::default().into() };
        // Drops of `a` (ids 1 and 3) left them in some shard; id 5 is live.
        let held = [board(1, "a"), board(2, "b"), board(3, "a"), board(4, "c"), board(5, "a")];
        let boards = Boards::new(RouterState::from_held(held.into()).with_stored_maxima(5, 0));
        let ids: Vec<(String, u64)> = boards.sorted().iter().map(|b| (b.name.to_string(), b.id)).collect();
        assert_eq!(ids, [("a".into(), 5), ("b".into(), 2), ("c".into(), 4)]);
        assert_eq!(boards.get("a").map(|b| b.id), Some(5));
        let same = |b: &SharedBoard| boards.names.get(&b.name).is_some_and(|n| SharedBoard::ptr_eq(n, b));
        assert!(boards.by_name.iter().all(same), "one copy of each board");
        assert_eq!(boards.next_board_id, 6);
    }

    fn asc() -> BoardConfig {
        BoardConfig { order: Order::Asc, ..BoardConfig::default() }
    }

    #[test]
    fn creating_is_idempotent_for_one_config_and_conflicts_for_another() {
        let mut boards = boards();
        let Ok(Created::New(board)) = boards.create("new", asc()) else { panic!("created") };
        assert_eq!(board.id, 10, "ids continue past the highest ever used");
        assert!(matches!(boards.create("new", asc()), Ok(Created::Exists)));
        assert!(matches!(boards.create("new", BoardConfig::default()), Err(Error::Conflict(_))));
        // A write's implicit creation takes the default config.
        assert_eq!(boards.for_write("implicit").config, BoardConfig::default().into());
        assert!(matches!(boards.create("implicit", asc()), Err(Error::Conflict(_))));
        // A dropped name is free for another config, under a new id.
        assert_eq!(boards.remove("new").map(|b| b.id), Some(10));
        let Ok(Created::New(again)) = boards.create("new", BoardConfig::default()) else { panic!("recreated") };
        assert_eq!(again.id, 12);
        assert_eq!(boards.sorted().iter().map(|b| &*b.name).collect::<Vec<_>>(), ["implicit", "new", "old"]);
    }

    #[test]
    fn pages_follow_byte_order_within_the_prefix() {
        let mut boards = boards();
        for name in ["lvl2", "lvl10", "lvl1", "lvm", "lv", "a", "lvl3"] {
            boards.for_write(name);
        }
        boards.remove("lvl3");
        let names = |page: Vec<SharedBoard>| page.iter().map(|b| b.name.to_string()).collect::<Vec<_>>();
        assert_eq!(names(boards.page("lvl", None, 10)), ["lvl1", "lvl10", "lvl2"]);
        assert_eq!(names(boards.page("lvl", None, 2)), ["lvl1", "lvl10"]);
        assert_eq!(names(boards.page("lvl", Some("lvl10"), 2)), ["lvl2"]);
        assert_eq!(names(boards.page("lvl", Some("a"), 1)), ["lvl1"], "after before the prefix");
        assert_eq!(names(boards.page("lvl", Some("zz"), 5)), Vec::<String>::new());
        assert_eq!(names(boards.page("", Some("lvm"), 5)), ["old"]);
        assert_eq!(boards.sorted().len(), 7);
    }

    #[test]
    fn arrival_sequences_continue_past_the_stored_ones() {
        let mut boards = boards();
        assert_eq!((boards.next_seq(), boards.next_seq()), (42, 43));
    }

    #[test]
    fn a_view_must_be_one_the_board_keeps() {
        let mut boards = boards();
        let daily = BoardConfig { windows: vec![Window::Daily, Window::All], keep: 2, ..BoardConfig::default() };
        assert!(matches!(boards.create("d", daily), Ok(Created::New(_))));
        let now = 1_780_272_000;
        let view = |window, period| View { window, period };
        let (board, today) = boards.view("d", view(None, 0), now).unwrap().unwrap();
        assert_eq!((&*board.name, today.window), ("d", Window::Daily.code()), "the first window by default");
        let (_, yesterday) = boards.view("d", view(Some(Window::Daily), -2), now).unwrap().unwrap();
        assert_ne!(yesterday.period, today.period);
        let refused = |window, period| boards.view("d", view(window, period), now).unwrap_err().to_string();
        assert!(refused(Some(Window::Daily), -3).contains("out of range"));
        assert!(refused(Some(Window::All), -1).contains("out of range"));
        assert!(refused(Some(Window::Weekly), 0).contains("no `weekly` window"));
        assert!(boards.view("missing", view(Some(Window::Weekly), -5), now).unwrap().is_none(), "reads as empty");
        assert!(boards.view("missing", view(Some(Window::All), -1), now).is_err());
    }
}
