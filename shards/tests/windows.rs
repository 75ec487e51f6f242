//! Time windows of a whole [`Shard`] against a plain-map oracle, with the
//! clock injected through [`Shard::set_time`].
//!
//! The oracle keeps, per (window, period), a map player -> (score, reach seq)
//! and applies each write's mode inside every window's *current* period
//! (today's best, this week's total: `incr` starts from 0 in a new period).
//! Random operations run at random, advancing times: a few seconds, across a
//! UTC midnight, a Monday 00:00 week start, a month end (Feb 29 2024,
//! Dec 31 -> Jan 1). After each commit every readable period of every window
//! (current and up to `keep` back) is compared: count, get, competition /
//! dense / ordinal ranks and the full list. Periods that fall out of `keep`
//! must be deleted by `expire(budget)` with small budgets, stay deleted
//! across a reopen, and leave the readable periods untouched.
//!
//! Dates are computed here by a calendar written independently of
//! `window.rs`.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use rankd_shards::key::{score_key, tiebreak, tree_key};
use rankd_shards::tree::BRANCHINGS;
use rankd_shards::window;
use rankd_shards::{
    Amount, Board, BoardConfig, Direction, Durability, Mode, Order, Record, Shard, ShardError, ShardOptions, Ties,
    TreeId, Upcoming, UpcomingWrite, Window,
};

const DAY: i64 = 86_400;

const WINDOWS: [Window; 4] = [Window::All, Window::Daily, Window::Weekly, Window::Monthly];

// ---------------------------------------------------------------- calendar

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn month_len(year: i64, month: u32) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a date (year >= 1970), by counting.
fn days_of(year: i64, month: u32, day: u32) -> i64 {
    let mut days = 0;
    for y in 1970..year {
        days += if is_leap(y) { 366 } else { 365 };
    }
    for m in 1..month {
        days += month_len(year, m);
    }
    days + i64::from(day) - 1
}

/// (year, month, day) of a day count since 1970-01-01 (>= 0), by counting.
fn date_of(mut days: i64) -> (i64, u32, u32) {
    let mut year = 1970;
    loop {
        let len = if is_leap(year) { 366 } else { 365 };
        if days < len {
            break;
        }
        days -= len;
        year += 1;
    }
    let mut month = 1;
    while days >= month_len(year, month) {
        days -= month_len(year, month);
        month += 1;
    }
    (year, month, days as u32 + 1)
}

/// Unix seconds of a UTC date-time.
fn at(year: i64, month: u32, day: u32, hour: i64, minute: i64, second: i64) -> i64 {
    days_of(year, month, day) * DAY + hour * 3600 + minute * 60 + second
}

/// Monday = 0 .. Sunday = 6 (1970-01-01 was a Thursday).
fn weekday(days: i64) -> i64 {
    (days + 3).rem_euclid(7)
}

/// The oracle's period numbering: days since the epoch, Mondays since
/// 1970-01-05 (the first one), months since January 1970.
fn period(w: Window, t: i64) -> u32 {
    let days = t.div_euclid(DAY);
    let p = match w {
        Window::All => 0,
        Window::Daily => days,
        Window::Weekly => (days - 4).div_euclid(7) + 1,
        Window::Monthly => {
            let (y, m, _) = date_of(days);
            (y - 1970) * 12 + i64::from(m) - 1
        }
    };
    u32::try_from(p).expect("times after 1970")
}

fn next_midnight(t: i64) -> i64 {
    (t.div_euclid(DAY) + 1) * DAY
}

fn next_monday(t: i64) -> i64 {
    let days = t.div_euclid(DAY);
    (days + 7 - weekday(days)) * DAY
}

fn next_month(t: i64) -> i64 {
    let (y, m, _) = date_of(t.div_euclid(DAY));
    let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    days_of(y, m, 1) * DAY
}

fn tid(board: &Board, w: Window, period: u32) -> TreeId {
    TreeId { board: board.id, window: w.code(), period }
}

/// Whether `tree` is out of its board's `keep` at `now` (oracle's view).
fn is_expired(board: &Board, tree: TreeId, now: i64) -> bool {
    match Window::from_code(tree.window) {
        None | Some(Window::All) => false,
        Some(w) => i64::from(tree.period) < i64::from(period(w, now)) - i64::from(board.config.keep),
    }
}

/// The readable trees of a window at `now`: current, then up to `keep` back.
fn readable(board: &Board, w: Window, now: i64) -> Vec<(i64, TreeId)> {
    let current = period(w, now);
    let back = if w == Window::All { 0 } else { board.config.keep };
    (0..=back).filter(|k| *k <= current).map(|k| (-i64::from(k), tid(board, w, current - k))).collect()
}

#[test]
fn calendar_helpers_know_the_dates() {
    // 2026-06-01 and 2024-01-01 are Mondays; 2024 is a leap year.
    assert_eq!(weekday(days_of(2026, 6, 1)), 0);
    assert_eq!(weekday(days_of(2024, 1, 1)), 0);
    assert_eq!(weekday(days_of(1970, 1, 5)), 0);
    assert_eq!(date_of(days_of(2024, 2, 29)), (2024, 2, 29));
    assert_eq!(date_of(days_of(2024, 2, 29) + 1), (2024, 3, 1));
    assert_eq!(date_of(days_of(2025, 12, 31) + 1), (2026, 1, 1));
    assert_eq!(next_month(at(2024, 2, 29, 23, 59, 59)), at(2024, 3, 1, 0, 0, 0));
    assert_eq!(next_month(at(2025, 12, 31, 0, 0, 0)), at(2026, 1, 1, 0, 0, 0));
    assert_eq!(next_monday(at(2026, 5, 31, 23, 59, 58)), at(2026, 6, 1, 0, 0, 0));
    assert_eq!(next_monday(at(2026, 6, 1, 0, 0, 0)), at(2026, 6, 8, 0, 0, 0));
    assert_eq!(next_midnight(at(2026, 6, 1, 0, 0, 0)), at(2026, 6, 2, 0, 0, 0));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    /// `window::period_of` agrees with the independent calendar, and
    /// `tree_at` counts back from it.
    #[test]
    fn periods_match_an_independent_calendar(t in 0i64..4_102_444_800, k in 0i64..5) {
        let board = Board { id: 9, name: "b".into(), config: BoardConfig { windows: WINDOWS.to_vec(), keep: 3, ..BoardConfig::default() }.into() };
        for w in WINDOWS {
            prop_assert_eq!(window::period_of(w, t), period(w, t), "{:?} at {}", w, t);
            let expected = u32::try_from(i64::from(period(w, t)) - k).ok().map(|p| tid(&board, w, p));
            prop_assert_eq!(window::tree_at(&board, w, t, -k), expected);
        }
    }
}

// ---------------------------------------------------------------- oracle

fn ok<T>(r: Result<T, ShardError>) -> Result<T, TestCaseError> {
    r.map_err(|e| TestCaseError::fail(format!("unexpected shard error: {e:?}")))
}

/// Is `a` strictly better than `b`?
fn better(order: Order, a: i64, b: i64) -> bool {
    match order {
        Order::Desc => a > b,
        Order::Asc => a < b,
    }
}

/// One period of one window.
#[derive(Debug, Clone, Default)]
struct Period {
    players: BTreeMap<String, Record>,
    /// Everyone ever written here (bounds the keys expiry must delete).
    ever: BTreeSet<String>,
}

#[derive(Debug, Clone)]
struct OBoard {
    board: Board,
    /// Periods not yet expired.
    periods: BTreeMap<TreeId, Period>,
}

impl OBoard {
    fn players(&self, tree: TreeId) -> BTreeMap<String, Record> {
        self.periods.get(&tree).map(|p| p.players.clone()).unwrap_or_default()
    }

    /// A write in every window's current period at `now`: `Ok(stored in
    /// the first window)`, or `Err(())` on overflow anywhere (nothing changes).
    fn write(&mut self, now: i64, name: &str, score: i64, mode: Mode, seq: u64) -> Result<i64, ()> {
        let order = self.board.config.order;
        let mut plans = Vec::new();
        for &w in &self.board.config.windows {
            let t = tid(&self.board, w, period(w, now));
            let old = self.periods.get(&t).and_then(|per| per.players.get(name)).copied();
            let new = match (mode, old) {
                (Mode::Set, _) | (Mode::Best | Mode::Incr, None) => score,
                (Mode::Best, Some(o)) => {
                    if better(order, score, o.score) {
                        score
                    } else {
                        o.score
                    }
                }
                (Mode::Incr, Some(o)) => o.score.checked_add(score).ok_or(())?,
            };
            plans.push((t, old, new));
        }
        let stored = plans[0].2;
        for (t, old, new) in plans {
            if old.map(|o| o.score) == Some(new) {
                continue; // unchanged: keeps when it was reached
            }
            let per = self.periods.entry(t).or_default();
            per.players.insert(name.to_string(), Record { score: new, seq });
            per.ever.insert(name.to_string());
        }
        Ok(stored)
    }

    /// Removes from every window's current period; whether the player was in
    /// the first window's.
    fn remove(&mut self, now: i64, name: &str) -> bool {
        let mut first = None;
        for &w in &self.board.config.windows {
            let present = self
                .periods
                .get_mut(&tid(&self.board, w, period(w, now)))
                .and_then(|p| p.players.remove(name))
                .is_some();
            first.get_or_insert(present);
        }
        first.unwrap_or(false)
    }

    /// Takes out the periods expired at `now`, with how many players each ever held.
    fn take_expired(&mut self, now: i64) -> Vec<(TreeId, usize)> {
        let board = self.board.clone();
        let mut out = Vec::new();
        self.periods.retain(|&t, per| {
            let expired = is_expired(&board, t, now);
            if expired {
                out.push((t, per.ever.len()));
            }
            !expired
        });
        out
    }
}

/// List order, written independently of the key layouts.
fn sorted(cfg: &BoardConfig, players: &BTreeMap<String, Record>) -> Vec<(String, Record)> {
    let mut v: Vec<(String, Record)> = players.iter().map(|(n, r)| (n.clone(), *r)).collect();
    v.sort_by(|a, b| {
        let by_score = match cfg.order {
            Order::Desc => b.1.score.cmp(&a.1.score),
            Order::Asc => a.1.score.cmp(&b.1.score),
        };
        by_score.then_with(|| match cfg.ties {
            Ties::Ordinal => a.1.seq.cmp(&b.1.seq).then_with(|| a.0.as_bytes().cmp(b.0.as_bytes())),
            Ties::Competition | Ties::Dense => a.0.as_bytes().cmp(b.0.as_bytes()),
        })
    });
    v
}

// ---------------------------------------------------------------- checks

/// One tree against the oracle's players. `gets` are the names whose `get`
/// is checked; `lists` needs a committed shard.
fn check_tree(
    shard: &Shard,
    cfg: &BoardConfig,
    tree: TreeId,
    players: &BTreeMap<String, Record>,
    gets: &[&str],
    lists: bool,
) -> Result<(), TestCaseError> {
    for &name in gets {
        prop_assert_eq!(ok(shard.get(tree, name))?, players.get(name).copied(), "get {:?} in {:?}", name, tree);
    }
    prop_assert_eq!(shard.count(tree), players.len() as u64, "count of {:?}", tree);

    let mut groups: BTreeMap<u64, u64> = BTreeMap::new();
    for r in players.values() {
        *groups.entry(score_key(r.score, cfg.order)).or_default() += 1;
    }
    let score_counts = shard.score_counts(tree);
    prop_assert_eq!(&score_counts, &groups.into_iter().collect::<Vec<_>>(), "score_counts of {:?}", tree);
    let distinct: BTreeSet<i64> = players.values().map(|r| r.score).collect();

    let list = sorted(cfg, players);
    let keys: Vec<u128> =
        list.iter().map(|(n, r)| tree_key(score_key(r.score, cfg.order), tiebreak(cfg.ties, n, r.seq))).collect();
    let own = shard.count_before(tree, &keys);
    for (i, (name, r)) in list.iter().enumerate() {
        let sk = score_key(r.score, cfg.order);
        let strictly = players.values().filter(|q| better(cfg.order, q.score, r.score)).count() as u64;
        let competition = 1 + shard.count_before(tree, &[tree_key(sk, 0)])[0];
        prop_assert_eq!(competition, 1 + strictly, "competition rank of {:?} in {:?}", name, tree);
        let dense = 1 + score_counts.iter().take_while(|(s, _)| *s < sk).count() as u64;
        let want_dense = 1 + distinct.iter().filter(|s| better(cfg.order, **s, r.score)).count() as u64;
        prop_assert_eq!(dense, want_dense, "dense rank of {:?} in {:?}", name, tree);
        let smaller = keys.iter().filter(|q| **q < keys[i]).count() as u64;
        prop_assert_eq!(own[i], smaller, "count_before own key of {:?} in {:?}", name, tree);
        if cfg.ties == Ties::Ordinal {
            // Ordinal rank is the list position.
            prop_assert_eq!(1 + own[i], 1 + i as u64, "ordinal rank of {:?} in {:?}", name, tree);
        }
    }

    if lists {
        let got = ok(shard.list(tree, cfg.ties, cfg.order, &[], Direction::Forward, 100_000))?;
        let got: Vec<(String, i64, u64)> = got.into_iter().map(|e| (e.player, e.score, e.seq)).collect();
        let want: Vec<(String, i64, u64)> =
            list.iter().map(|(n, r)| (n.clone(), r.score, if cfg.ties == Ties::Ordinal { r.seq } else { 0 })).collect();
        prop_assert_eq!(got, want, "full list of {:?} ({:?})", tree, cfg);
    }
    Ok(())
}

/// Every readable period of every window of `ob` at `now`.
fn check_board(shard: &Shard, ob: &OBoard, now: i64, gets: &[&str], lists: bool) -> Result<(), TestCaseError> {
    let board = &ob.board;
    for &w in &board.config.windows {
        for (offset, tree) in readable(board, w, now) {
            prop_assert_eq!(window::tree_at(board, w, now, offset), Some(tree), "tree_at {:?} {}", w, offset);
            check_tree(shard, &board.config, tree, &ob.players(tree), gets, lists)?;
        }
    }
    Ok(())
}

/// An expired period is gone: no tree, no count, no player, no index entry.
fn check_gone(shard: &Shard, board: &Board, tree: TreeId, names: &[&str], what: &str) -> Result<(), TestCaseError> {
    prop_assert!(!shard.tree_ids().any(|t| t == tree), "{}: expired {:?} still in tree_ids", what, tree);
    prop_assert_eq!(shard.count(tree), 0, "{}: count of expired {:?}", what, tree);
    prop_assert!(shard.score_counts(tree).is_empty(), "{}: score_counts of expired {:?}", what, tree);
    for &name in names {
        prop_assert_eq!(ok(shard.get(tree, name))?, None, "{}: get {:?} in expired {:?}", what, name, tree);
    }
    let cfg = &board.config;
    let list = ok(shard.list(tree, cfg.ties, cfg.order, &[], Direction::Forward, 100_000))?;
    prop_assert!(list.is_empty(), "{}: index of expired {:?} still holds {:?}", what, tree, list);
    Ok(())
}

// ---------------------------------------------------------------- ops

/// Named players: short names, two sharing an 8-byte prefix (tiebreak),
/// multi-byte UTF-8.
const FIXED: [&str; 9] = ["a", "b", "bob", "abcdefgh1", "abcdefgh2", "é", "🎮", "Z", "zed"];
/// Extra players for bulk writes: enough to burst a count-tree leaf (64 keys).
const BULK: usize = 70;

fn names() -> Vec<String> {
    FIXED.iter().map(|s| s.to_string()).chain((0..BULK).map(|i| format!("p{i:02}"))).collect()
}

#[derive(Debug, Clone, Copy)]
enum Advance {
    Secs(i64),
    /// To the next UTC midnight, plus seconds.
    NextDay(i64),
    /// To the next Monday 00:00, plus seconds.
    NextMonday(i64),
    /// To the next 1st of a month 00:00, plus seconds.
    NextMonth(i64),
    /// To one second before the next midnight / Monday / month.
    BeforeNextDay,
    BeforeNextMonday,
    BeforeNextMonth,
    Days(i64),
}

impl Advance {
    fn apply(self, t: i64) -> i64 {
        match self {
            Advance::Secs(s) => t + s,
            Advance::NextDay(s) => next_midnight(t) + s,
            Advance::NextMonday(s) => next_monday(t) + s,
            Advance::NextMonth(s) => next_month(t) + s,
            Advance::BeforeNextDay => next_midnight(t) - 1,
            Advance::BeforeNextMonday => next_monday(t) - 1,
            Advance::BeforeNextMonth => next_month(t) - 1,
            Advance::Days(d) => t + d * DAY,
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        slot: usize,
        player: usize,
        score: i64,
        mode: Mode,
    },
    Remove {
        slot: usize,
        player: usize,
    },
    WriteMany {
        slot: usize,
        entries: Vec<(usize, i64)>,
        mode: Mode,
    },
    /// Many players at once (bursts count-tree leaves, gives expiry more to delete).
    Bulk {
        slot: usize,
        start: usize,
        len: usize,
        mode: Mode,
    },
    Advance(Advance),
    Commit,
    /// Commit, then checkpoint the count trees (trims the change log).
    Checkpoint,
    /// Commit, then `calls` calls of `expire(budget)`.
    Expire {
        budget: usize,
        calls: usize,
    },
    /// Commit, then `expire(3)` until every expired period must be deleted.
    Drain,
    /// Commit (and drain, if asked), drop the shard, reopen it, set the time again.
    Reopen {
        drain_first: bool,
    },
    /// Drop the shard with the batch still open: the batch is lost.
    Crash,
}

const SLOTS: usize = 2;

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![Just(Mode::Set), Just(Mode::Best), Just(Mode::Incr)]
}

fn score() -> impl Strategy<Value = i64> {
    prop_oneof![
        10 => -3i64..=3,
        1 => Just(i64::MAX),
        1 => Just(i64::MIN),
        1 => i64::MAX - 2..=i64::MAX,
        1 => any::<i64>(),
    ]
}

fn player() -> impl Strategy<Value = usize> {
    prop_oneof![8 => 0..FIXED.len(), 1 => FIXED.len()..FIXED.len() + BULK]
}

fn advance() -> impl Strategy<Value = Advance> {
    prop_oneof![
        4 => (0i64..=3).prop_map(Advance::Secs),
        2 => (1i64..=20_000).prop_map(Advance::Secs),
        3 => (0i64..=2).prop_map(Advance::NextDay),
        2 => (0i64..=2).prop_map(Advance::NextMonday),
        2 => (0i64..=2).prop_map(Advance::NextMonth),
        2 => Just(Advance::BeforeNextDay),
        1 => Just(Advance::BeforeNextMonday),
        2 => Just(Advance::BeforeNextMonth),
        1 => (2i64..=40).prop_map(Advance::Days),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        40 => (0..SLOTS, player(), score(), mode()).prop_map(|(slot, player, score, mode)| Op::Write { slot, player, score, mode }),
        6 => (0..SLOTS, player()).prop_map(|(slot, player)| Op::Remove { slot, player }),
        3 => (0..SLOTS, proptest::collection::vec((player(), score()), 0..5), mode())
            .prop_map(|(slot, entries, mode)| Op::WriteMany { slot, entries, mode }),
        1 => (0..SLOTS, 0..BULK, 10..BULK, mode()).prop_map(|(slot, start, len, mode)| Op::Bulk { slot, start, len, mode }),
        20 => advance().prop_map(Op::Advance),
        10 => Just(Op::Commit),
        2 => Just(Op::Checkpoint),
        5 => (prop_oneof![Just(1usize), Just(3), Just(7), Just(1000)], 1usize..=3)
            .prop_map(|(budget, calls)| Op::Expire { budget, calls }),
        3 => Just(Op::Drain),
        3 => any::<bool>().prop_map(|drain_first| Op::Reopen { drain_first }),
        2 => Just(Op::Crash),
    ]
}

fn board_config() -> impl Strategy<Value = BoardConfig> {
    (
        proptest::sample::subsequence(WINDOWS.to_vec(), 1..=4).prop_shuffle(),
        1u32..=3,
        prop_oneof![Just(Order::Desc), Just(Order::Asc)],
        prop_oneof![Just(Ties::Competition), Just(Ties::Dense), Just(Ties::Ordinal)],
    )
        .prop_map(|(windows, keep, order, ties)| BoardConfig { order, ties, windows, keep, fields: Vec::new() })
}

/// Starting moments just before interesting boundaries.
fn start() -> impl Strategy<Value = i64> {
    proptest::sample::select(vec![
        at(2024, 2, 28, 23, 59, 50),  // leap day ahead
        at(2024, 2, 29, 23, 59, 58),  // leap day -> March
        at(2023, 12, 31, 23, 59, 58), // Sunday: day, week, month and year roll at once
        at(2025, 12, 31, 23, 59, 55), // new year on a Thursday: week does not roll
        at(2026, 5, 31, 23, 59, 58),  // Sunday: day, week, month roll at once
        at(2026, 11, 22, 12, 0, 0),
    ])
}

#[derive(Debug, Clone, Copy)]
struct Knobs {
    branching: u32,
    sync: bool,
    checkpoint_every: Option<u64>,
    cached_players: Option<usize>,
}

fn knobs() -> impl Strategy<Value = Knobs> {
    (
        proptest::sample::select(BRANCHINGS.to_vec()),
        // fsync costs wall time and is not what this file tests.
        Just(false),
        prop_oneof![Just(None), Just(Some(1)), Just(Some(7))],
        prop_oneof![Just(None), Just(Some(0)), Just(Some(5))],
    )
        .prop_map(|(branching, sync, checkpoint_every, cached_players)| Knobs {
            branching,
            sync,
            checkpoint_every,
            cached_players,
        })
}

fn options(knobs: Knobs) -> ShardOptions {
    let defaults = ShardOptions::default();
    #[allow(clippy::needless_update)]
    ShardOptions {
        branching: knobs.branching,
        durability: if knobs.sync { Durability::Sync } else { Durability::Buffered },
        cache_bytes: 1 << 20,
        checkpoint_every: knobs.checkpoint_every.unwrap_or(defaults.checkpoint_every),
        cached_players: knobs.cached_players.unwrap_or(defaults.cached_players),
        ..defaults
    }
}

// ---------------------------------------------------------------- the run

struct Run {
    dir: tempfile::TempDir,
    options: ShardOptions,
    names: Vec<String>,
    shard: Option<Shard>,
    live: Vec<OBoard>,
    committed: Vec<OBoard>,
    staged: bool,
    now: i64,
    seq: u64,
    /// Expired periods whose keys may still be stored, with the players they ever held.
    pending: BTreeMap<TreeId, usize>,
    /// Expired periods that a drain has deleted: they must never come back.
    drained: BTreeSet<TreeId>,
    /// A reopen brought pending periods back (partly deleted) and no `expire`
    /// has run since: `check` may legitimately see them half-deleted.
    half_deleted: bool,
}

impl Run {
    fn shard(&mut self) -> &mut Shard {
        self.shard.as_mut().expect("shard open")
    }

    fn board_of(&self, tree: TreeId) -> Board {
        self.live.iter().find(|ob| ob.board.id == tree.board).expect("board of tree").board.clone()
    }

    fn gets(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }

    fn take_expired(&mut self) {
        let now = self.now;
        for ob in &mut self.live {
            for (tree, ever) in ob.take_expired(now) {
                assert!(!self.drained.contains(&tree), "a drained period came back in the oracle: {tree:?}");
                let e = self.pending.entry(tree).or_insert(0);
                *e = (*e).max(ever);
            }
        }
    }

    fn write(&mut self, slot: usize, player: usize, score: i64, mode: Mode) -> Result<(), TestCaseError> {
        self.seq += 1;
        let seq = self.seq;
        let now = self.now;
        let name = self.names[player].clone();
        let board = self.live[slot].board.clone();
        let expected = self.live[slot].write(now, &name, score, mode, seq);
        // As the server does: a look ahead that must change nothing.
        self.shard().prefetch([Upcoming::Write(UpcomingWrite {
            board: &board,
            player: &name,
            amount: Amount::Score(score),
            mode,
            seq,
        })]);
        let got = self.shard().write(&board, &name, score, mode, seq);
        match (expected, got) {
            (Ok(want), Ok(stored)) => {
                prop_assert_eq!(stored, want, "stored score of {:?} {:?} {} at {}", name, mode, score, now);
                self.staged = true;
            }
            (Err(()), Err(ShardError::Overflow)) => {}
            (want, got) => {
                return Err(TestCaseError::fail(format!(
                    "write {name:?} {mode:?} {score} seq {seq} at {now} on {board:?}: oracle {want:?}, shard {got:?}"
                )))
            }
        }
        Ok(())
    }

    /// In-memory reads of the current periods for a few players (valid with
    /// writes staged).
    fn check_current(&self, slot: usize, names: &[&str]) -> Result<(), TestCaseError> {
        let ob = &self.live[slot];
        let shard = self.shard.as_ref().unwrap();
        for &w in &ob.board.config.windows {
            let tree = tid(&ob.board, w, period(w, self.now));
            check_tree(shard, &ob.board.config, tree, &ob.players(tree), names, false)?;
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<(), TestCaseError> {
        let staged = self.staged;
        let shard = self.shard.as_mut().expect("shard open");
        prop_assert_eq!(shard.has_staged(), staged, "has_staged");
        if staged {
            prop_assert!(matches!(shard.expire(3), Err(ShardError::NeedsCommit)), "expire with staged writes");
        }
        ok(shard.commit())?;
        self.committed = self.live.clone();
        self.staged = false;
        Ok(())
    }

    /// Everything readable equals the oracle; expired periods are gone from
    /// memory; drained ones are gone from storage too. Needs a committed shard.
    fn check_all(&self, what: &str) -> Result<(), TestCaseError> {
        let shard = self.shard.as_ref().unwrap();
        let gets = self.gets();
        for ob in &self.live {
            check_board(shard, ob, self.now, &gets, true)?;
        }
        for &tree in &self.drained {
            check_gone(shard, &self.board_of(tree), tree, &gets, what)?;
        }
        for t in shard.tree_ids() {
            let ob = self.live.iter().find(|ob| ob.board.id == t.board);
            prop_assert!(ob.is_some(), "{}: tree {:?} of an unknown board", what, t);
            let w = Window::from_code(t.window);
            prop_assert!(
                w.is_some_and(|w| ob.unwrap().board.config.windows.contains(&w)),
                "{}: tree {:?} of a window the board lacks",
                what,
                t
            );
        }
        if !self.half_deleted {
            ok(shard.check())?;
        }
        Ok(())
    }

    fn expire(&mut self, budget: usize, calls: usize) -> Result<(), TestCaseError> {
        let now = self.now;
        for _ in 0..calls {
            let newly = ok(self.shard().expire(budget))?;
            for tree in newly {
                let board = self.board_of(tree);
                prop_assert!(is_expired(&board, tree, now), "expire returned {:?}, not expired at {}", tree, now);
            }
        }
        self.half_deleted = false;
        let shard = self.shard.as_ref().unwrap();
        for t in shard.tree_ids() {
            let board = self.board_of(t);
            prop_assert!(!is_expired(&board, t, now), "expired {:?} still in tree_ids after expire at {}", t, now);
        }
        for &tree in self.pending.keys() {
            prop_assert_eq!(shard.count(tree), 0, "count of expired {:?} after expire", tree);
        }
        Ok(())
    }

    fn drain(&mut self) -> Result<(), TestCaseError> {
        const BUDGET: usize = 3;
        // Each pending period stores at most one player key and one index
        // key per player it ever held, and fewer leaves than that.
        let calls: usize = self.pending.values().map(|ever| (3 * ever + 1).div_ceil(BUDGET) + 2).sum::<usize>() + 2;
        self.expire(BUDGET, calls)?;
        let pending = std::mem::take(&mut self.pending);
        let gets = self.gets();
        let shard = self.shard.as_ref().unwrap();
        for &tree in pending.keys() {
            check_gone(shard, &self.board_of(tree), tree, &gets, "after drain")?;
        }
        self.drained.extend(pending.into_keys());
        Ok(())
    }

    fn reopen(&mut self) -> Result<(), TestCaseError> {
        drop(self.shard.take());
        let mut shard = ok(Shard::open(self.dir.path(), self.options.clone()))?;
        prop_assert!(!shard.has_staged());
        shard.set_time(self.now);
        // Drained periods left nothing in storage: no player, no index entry.
        let gets = self.gets();
        for &tree in &self.drained {
            let cfg = &self.board_of(tree).config;
            for &name in &gets {
                prop_assert_eq!(ok(shard.get(tree, name))?, None, "after reopen: get {:?} in drained {:?}", name, tree);
            }
            let list = ok(shard.list(tree, cfg.ties, cfg.order, &[], Direction::Forward, 100_000))?;
            prop_assert!(list.is_empty(), "after reopen: index of drained {:?} holds {:?}", tree, list);
        }
        self.half_deleted = !self.pending.is_empty();
        self.shard = Some(shard);
        Ok(())
    }

    fn apply(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Write { slot, player, score, mode } => {
                self.write(slot, player, score, mode)?;
                let name = self.names[player].clone();
                self.check_current(slot, &[&name])?;
            }
            Op::Remove { slot, player } => {
                let name = self.names[player].clone();
                let board = self.live[slot].board.clone();
                let now = self.now;
                let expected = self.live[slot].remove(now, &name);
                let got = ok(self.shard().remove(&board, &name))?;
                prop_assert_eq!(got, expected, "remove {:?} at {}", name, now);
                self.staged = true;
                self.check_current(slot, &[&name])?;
            }
            Op::WriteMany { slot, entries, mode } => {
                let board = self.live[slot].board.clone();
                let now = self.now;
                let mut batch = Vec::new();
                for &(player, score) in &entries {
                    self.seq += 1;
                    batch.push((self.names[player].clone(), Amount::Score(score), self.seq));
                }
                let mut after = self.live[slot].clone();
                let expected: Result<Vec<i64>, ()> = entries
                    .iter()
                    .zip(&batch)
                    .map(|(&(_, s), (n, _, seq))| after.write(now, n, s, mode, *seq))
                    .collect();
                let got = self.shard().write_many(&board, &batch, mode);
                match (expected, got) {
                    (Ok(want), Ok(stored)) => {
                        prop_assert_eq!(stored, want, "write_many {:?} {:?}", mode, batch);
                        self.live[slot] = after;
                        self.staged |= !batch.is_empty();
                    }
                    (Err(()), Err(ShardError::Overflow)) => {}
                    (want, got) => {
                        return Err(TestCaseError::fail(format!(
                            "write_many {mode:?} {batch:?} at {now}: oracle {want:?}, shard {got:?}"
                        )))
                    }
                }
                let names: Vec<String> = batch.iter().map(|e| e.0.clone()).collect();
                self.check_current(slot, &names.iter().map(String::as_str).collect::<Vec<_>>())?;
            }
            Op::Bulk { slot, start, len, mode } => {
                for i in 0..len {
                    self.write(slot, FIXED.len() + (start + i) % BULK, (i % 5) as i64 - 2, mode)?;
                }
                let gets = self.gets();
                self.check_current(slot, &gets)?;
            }
            Op::Advance(adv) => {
                let now = adv.apply(self.now);
                prop_assert!(now >= self.now);
                self.now = now;
                self.shard().set_time(now);
                self.take_expired();
            }
            Op::Commit => {
                self.commit()?;
                self.check_all("after commit")?;
            }
            Op::Checkpoint => {
                self.commit()?;
                ok(self.shard().checkpoint())?;
                self.check_all("after checkpoint")?;
            }
            Op::Expire { budget, calls } => {
                self.commit()?;
                self.expire(budget, calls)?;
                self.check_all("after expire")?;
            }
            Op::Drain => {
                self.commit()?;
                self.drain()?;
                self.check_all("after drain")?;
            }
            Op::Reopen { drain_first } => {
                self.commit()?;
                if drain_first {
                    self.drain()?;
                }
                self.reopen()?;
                self.check_all("after reopen")?;
            }
            Op::Crash => {
                self.reopen()?;
                self.live = self.committed.clone();
                self.staged = false;
                self.take_expired();
                self.check_all("after crash")?;
            }
        }
        Ok(())
    }
}

/// A directory for a shard: in memory (tmpfs) where there is one, since
/// creating a fjall database costs many fsyncs (~0.4 s on a busy disk) and
/// fsync is not what this file tests.
fn scratch_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::Builder::new().prefix("rankd-windows-").tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::tempdir().expect("tempdir")
}

fn run(configs: Vec<BoardConfig>, start: i64, knobs: Knobs, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let options = options(knobs);
    let dir = scratch_dir();
    let mut shard = ok(Shard::open(dir.path(), options.clone()))?;
    shard.set_time(start);
    let boards: Vec<OBoard> = configs
        .into_iter()
        .enumerate()
        .map(|(i, config)| OBoard {
            board: Board { id: i as u64 + 1, name: format!("b{i}").into(), config: config.into() },
            periods: BTreeMap::new(),
        })
        .collect();
    let mut run = Run {
        dir,
        options,
        names: names(),
        shard: Some(shard),
        committed: boards.clone(),
        live: boards,
        staged: false,
        now: start,
        seq: 0,
        pending: BTreeMap::new(),
        drained: BTreeSet::new(),
        half_deleted: false,
    };
    for op in ops {
        run.apply(op)?;
    }
    // Finally: far enough ahead that every periodic window has expired
    // periods, drained, and read back after a reopen.
    run.apply(Op::Commit)?;
    run.apply(Op::Advance(Advance::NextMonth(1)))?;
    run.apply(Op::Advance(Advance::Days(100)))?;
    run.apply(Op::Reopen { drain_first: true })?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 150,
        // Only this file may be created: no regression files next to it.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn windows_match_oracle(
        configs in proptest::collection::vec(board_config(), SLOTS),
        start in start(),
        knobs in knobs(),
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run(configs, start, knobs, ops)?;
    }
}

// ---------------------------------------------------------------- fixed dates

fn open(dir: &std::path::Path, now: i64) -> Shard {
    let mut shard = Shard::open(dir, ShardOptions { durability: Durability::Buffered, ..ShardOptions::default() })
        .expect("open shard");
    shard.set_time(now);
    shard
}

fn board(id: u64, windows: Vec<Window>, keep: u32, ties: Ties) -> Board {
    Board {
        id,
        name: format!("b{id}").into(),
        config: BoardConfig { order: Order::Desc, ties, windows, keep, fields: Vec::new() }.into(),
    }
}

fn rec(score: i64, seq: u64) -> Option<Record> {
    Some(Record { score, seq })
}

/// (player, score) in list order.
fn listed(shard: &Shard, board: &Board, tree: TreeId) -> Vec<(String, i64)> {
    let cfg = &board.config;
    shard
        .list(tree, cfg.ties, cfg.order, &[], Direction::Forward, 1000)
        .expect("list")
        .into_iter()
        .map(|e| (e.player, e.score))
        .collect()
}

fn l(entries: &[(&str, i64)]) -> Vec<(String, i64)> {
    entries.iter().map(|(p, s)| (p.to_string(), *s)).collect()
}

#[test]
fn one_write_updates_every_window_atomically() {
    let dir = scratch_dir();
    let sunday = at(2026, 5, 31, 23, 59, 58);
    let monday = at(2026, 6, 1, 0, 0, 1);
    let b = board(1, vec![Window::Weekly, Window::All, Window::Daily, Window::Monthly], 1, Ties::Competition);
    let trees = |now: i64| -> Vec<TreeId> { WINDOWS.iter().map(|&w| tid(&b, w, period(w, now))).collect() };

    let mut shard = open(dir.path(), sunday);
    // Staged: visible to in-memory reads of every window at once.
    assert_eq!(shard.write(&b, "ann", 10, Mode::Incr, 1).unwrap(), 10);
    for t in trees(sunday) {
        assert_eq!(shard.get(t, "ann").unwrap(), rec(10, 1), "{t:?}");
        assert_eq!(shard.count(t), 1, "{t:?}");
    }
    // A crash before the commit loses it in every window.
    drop(shard);
    let mut shard = open(dir.path(), sunday);
    for t in trees(sunday) {
        assert_eq!(shard.get(t, "ann").unwrap(), None, "{t:?}");
        assert_eq!(shard.count(t), 0, "{t:?}");
    }
    shard.check().unwrap();

    assert_eq!(shard.write(&b, "ann", 10, Mode::Incr, 2).unwrap(), 10);
    assert_eq!(shard.write(&b, "bob", 7, Mode::Set, 3).unwrap(), 7);
    assert_eq!(shard.write(&b, "ann", i64::MAX - 10, Mode::Incr, 4).unwrap(), i64::MAX);
    shard.commit().unwrap();
    drop(shard);
    let mut shard = open(dir.path(), sunday);
    for t in trees(sunday) {
        assert_eq!(shard.get(t, "ann").unwrap(), rec(i64::MAX, 4), "{t:?}");
        assert_eq!(shard.get(t, "bob").unwrap(), rec(7, 3), "{t:?}");
        assert_eq!(listed(&shard, &b, t), l(&[("ann", i64::MAX), ("bob", 7)]), "{t:?}");
    }

    // Monday: day, week and month roll together; `all` does not. An incr
    // that fits the new periods (0 + 1) but overflows all-time changes nothing.
    shard.set_time(monday);
    let new = trees(monday);
    let old = trees(sunday);
    for i in 1..4 {
        assert_eq!(new[i].period, old[i].period + 1, "{:?} rolls", WINDOWS[i]);
    }
    assert_eq!(new[0], old[0]);
    assert!(matches!(shard.write(&b, "ann", 1, Mode::Incr, 5), Err(ShardError::Overflow)));
    assert!(!shard.has_staged());
    assert!(matches!(
        shard.write_many(&b, &[("bob".into(), Amount::Score(1), 6), ("ann".into(), Amount::Score(1), 7)], Mode::Incr),
        Err(ShardError::Overflow)
    ));
    assert!(!shard.has_staged());
    for t in &new[1..] {
        assert_eq!(shard.count(*t), 0, "{t:?}");
        assert_eq!(shard.get(*t, "ann").unwrap(), None);
        assert_eq!(shard.get(*t, "bob").unwrap(), None);
    }
    assert_eq!(shard.get(new[0], "bob").unwrap(), rec(7, 3));

    // The first window's score is what a write returns.
    assert_eq!(shard.write(&b, "bob", 2, Mode::Incr, 8).unwrap(), 2);
    shard.commit().unwrap();
    assert_eq!(shard.get(new[0], "bob").unwrap(), rec(9, 8));
    for t in &new[1..] {
        assert_eq!(shard.get(*t, "bob").unwrap(), rec(2, 8), "{t:?}");
        assert_eq!(listed(&shard, &b, *t), l(&[("bob", 2)]), "{t:?}");
    }
    shard.check().unwrap();
}

#[test]
fn rollover_starts_empty_and_keeps_previous_period() {
    let dir = scratch_dir();
    let sunday = at(2026, 5, 31, 23, 59, 58);
    let monday = at(2026, 6, 1, 0, 0, 1);
    let tuesday = at(2026, 6, 2, 0, 0, 0);
    let b = board(1, vec![Window::Daily, Window::Weekly, Window::Monthly, Window::All], 1, Ties::Ordinal);
    let [daily, weekly, monthly, all] = [Window::Daily, Window::Weekly, Window::Monthly, Window::All];
    let cur = |w: Window, now: i64| window::tree_at(&b, w, now, 0).unwrap();
    let prev = |w: Window, now: i64| window::tree_at(&b, w, now, -1).unwrap();

    let mut shard = open(dir.path(), sunday);
    shard.write(&b, "ann", 5, Mode::Incr, 1).unwrap();
    shard.write(&b, "bob", 3, Mode::Best, 2).unwrap();
    assert_eq!(shard.write(&b, "bob", 1, Mode::Best, 3).unwrap(), 3); // today's best stays 3
    shard.commit().unwrap();

    shard.set_time(monday);
    for w in [daily, weekly, monthly] {
        assert_eq!(prev(w, monday), cur(w, sunday), "{w:?}: the previous period is Sunday's");
        assert_eq!(shard.count(cur(w, monday)), 0, "{w:?}: a new period starts empty");
        assert_eq!(listed(&shard, &b, prev(w, monday)), l(&[("ann", 5), ("bob", 3)]), "{w:?}");
    }
    assert_eq!(window::tree_at(&b, all, monday, -1), None);
    assert_eq!(cur(all, monday), cur(all, sunday));

    // incr starts from 0 in the new period; best keeps the period's best.
    assert_eq!(shard.write(&b, "ann", 2, Mode::Incr, 4).unwrap(), 2);
    assert_eq!(shard.write(&b, "bob", 1, Mode::Best, 5).unwrap(), 1);
    assert_eq!(shard.write(&b, "cat", 2, Mode::Set, 6).unwrap(), 2);
    shard.commit().unwrap();
    for w in [daily, weekly, monthly] {
        // Ordinal: ann reached 2 before cat.
        assert_eq!(listed(&shard, &b, cur(w, monday)), l(&[("ann", 2), ("cat", 2), ("bob", 1)]), "{w:?}");
        assert_eq!(shard.get(prev(w, monday), "ann").unwrap(), rec(5, 1));
        assert_eq!(shard.get(prev(w, monday), "bob").unwrap(), rec(3, 2));
    }
    assert_eq!(listed(&shard, &b, cur(all, monday)), l(&[("ann", 7), ("bob", 3), ("cat", 2)]));
    assert_eq!(shard.get(cur(all, monday), "bob").unwrap(), rec(3, 2), "unchanged: keeps its reach seq");

    // Remove takes the player out of every current period, not the previous ones.
    assert!(shard.remove(&b, "ann").unwrap());
    shard.commit().unwrap();
    for w in [daily, weekly, monthly, all] {
        assert_eq!(shard.get(cur(w, monday), "ann").unwrap(), None, "{w:?}");
    }
    for w in [daily, weekly, monthly] {
        assert_eq!(shard.get(prev(w, monday), "ann").unwrap(), rec(5, 1), "{w:?}");
    }

    // Tuesday: Sunday's daily period falls out of keep = 1; Sunday's week and
    // month are still the previous ones.
    shard.set_time(tuesday);
    let gone = cur(daily, sunday);
    assert_eq!(window::tree_at(&b, daily, tuesday, -2), Some(gone));
    assert!(window::expired(&b.config, gone, tuesday));
    let mut newly = Vec::new();
    for _ in 0..10 {
        newly.extend(shard.expire(1).unwrap());
    }
    assert_eq!(newly, vec![gone]);
    assert!(!shard.tree_ids().any(|t| t == gone));
    assert_eq!(shard.count(gone), 0);
    assert_eq!(shard.get(gone, "ann").unwrap(), None);
    assert!(listed(&shard, &b, gone).is_empty());
    assert_eq!(listed(&shard, &b, prev(daily, tuesday)), l(&[("cat", 2), ("bob", 1)]));
    assert_eq!(listed(&shard, &b, prev(weekly, tuesday)), l(&[("ann", 5), ("bob", 3)]));
    assert_eq!(listed(&shard, &b, cur(weekly, tuesday)), l(&[("cat", 2), ("bob", 1)]));
    assert_eq!(listed(&shard, &b, prev(monthly, tuesday)), l(&[("ann", 5), ("bob", 3)]));
    assert_eq!(listed(&shard, &b, cur(all, tuesday)), l(&[("bob", 3), ("cat", 2)]));
    shard.check().unwrap();
}

/// A deleted period must not come back when the shard is reopened.
#[test]
fn expired_period_stays_deleted_after_reopen() {
    let dir = scratch_dir();
    let day1 = at(2024, 2, 28, 12, 0, 0);
    let day3 = at(2024, 3, 1, 0, 0, 0);
    let b = board(1, vec![Window::Daily], 1, Ties::Competition);
    let gone = window::tree_at(&b, Window::Daily, day1, 0).unwrap();

    let mut shard = open(dir.path(), day1);
    shard.write(&b, "ann", 5, Mode::Set, 1).unwrap();
    shard.write(&b, "bob", 6, Mode::Set, 2).unwrap();
    shard.commit().unwrap();
    shard.set_time(day3);
    for _ in 0..10 {
        shard.expire(3).unwrap();
    }
    assert_eq!(shard.count(gone), 0);
    assert!(listed(&shard, &b, gone).is_empty());
    assert_eq!(shard.get(gone, "ann").unwrap(), None);
    drop(shard);

    let shard = open(dir.path(), day3);
    // Storage really is clean ...
    assert_eq!(shard.get(gone, "ann").unwrap(), None);
    assert_eq!(shard.get(gone, "bob").unwrap(), None);
    assert!(listed(&shard, &b, gone).is_empty());
    // ... so the count trees must not hold the period either.
    let in_trees = shard.tree_ids().any(|t| t == gone);
    let (count, check) = (shard.count(gone), shard.check());
    assert!(
        !in_trees && count == 0 && check.is_ok(),
        "reopened shard holds the expired {gone:?} again: in tree_ids {in_trees}, count {count}, check {check:?}"
    );
}

#[test]
fn leap_day_and_new_year_roll_the_right_windows() {
    let dir = scratch_dir();
    let b = board(1, vec![Window::Monthly, Window::Daily, Window::Weekly], 2, Ties::Dense);
    let mut shard = open(dir.path(), at(2024, 2, 28, 23, 59, 59));
    let mut seq = 0;
    let mut incr = |shard: &mut Shard, now: i64, by: i64| {
        seq += 1;
        shard.set_time(now);
        let stored = shard.write(&b, "ann", by, Mode::Incr, seq).unwrap();
        shard.commit().unwrap();
        stored
    };
    let month = |now: i64| window::tree_at(&b, Window::Monthly, now, 0).unwrap();
    let day = |now: i64| window::tree_at(&b, Window::Daily, now, 0).unwrap();
    let week = |now: i64| window::tree_at(&b, Window::Weekly, now, 0).unwrap();

    // Wed Feb 28 -> Thu Feb 29 -> Fri Mar 1 2024: the month rolls only at March.
    assert_eq!(incr(&mut shard, at(2024, 2, 28, 23, 59, 59), 1), 1);
    assert_eq!(incr(&mut shard, at(2024, 2, 29, 0, 0, 0), 2), 3);
    assert_eq!(incr(&mut shard, at(2024, 2, 29, 23, 59, 59), 4), 7);
    assert_eq!(incr(&mut shard, at(2024, 3, 1, 0, 0, 0), 8), 8);
    let feb = month(at(2024, 2, 1, 0, 0, 0));
    assert_eq!(shard.get(feb, "ann").unwrap().map(|r| r.score), Some(7));
    assert_eq!(shard.get(day(at(2024, 2, 29, 5, 0, 0)), "ann").unwrap().map(|r| r.score), Some(6));
    assert_eq!(shard.get(day(at(2024, 2, 28, 5, 0, 0)), "ann").unwrap().map(|r| r.score), Some(1));
    assert_eq!(shard.get(week(at(2024, 3, 1, 0, 0, 0)), "ann").unwrap().map(|r| r.score), Some(15));
    assert_eq!(window::tree_at(&b, Window::Monthly, at(2024, 3, 1, 0, 0, 0), -1), Some(feb));

    // Tue Dec 31 2024 -> Wed Jan 1 2025: day and month roll, the week does not.
    let eve = at(2024, 12, 31, 23, 59, 59);
    let new_year = at(2025, 1, 1, 0, 0, 0);
    assert_eq!(incr(&mut shard, eve, 100), 100);
    assert_eq!(incr(&mut shard, new_year, 1), 1);
    assert_eq!(month(new_year).period, month(eve).period + 1);
    assert_eq!(day(new_year).period, day(eve).period + 1);
    assert_eq!(week(new_year), week(eve));
    assert_eq!(shard.get(week(new_year), "ann").unwrap().map(|r| r.score), Some(101));
    assert_eq!(shard.get(month(eve), "ann").unwrap().map(|r| r.score), Some(100));
    assert_eq!(shard.get(month(new_year), "ann").unwrap().map(|r| r.score), Some(1));

    // Everything from 2024 except December (keep = 2 months back from
    // January: December and November) is expired by now.
    shard.set_time(new_year);
    for _ in 0..50 {
        shard.expire(3).unwrap();
    }
    assert_eq!(shard.count(feb), 0);
    assert_eq!(shard.get(feb, "ann").unwrap(), None);
    assert_eq!(shard.count(month(eve)), 1);
    let mut left: Vec<TreeId> = shard.tree_ids().collect();
    left.sort();
    let mut want = vec![month(eve), month(new_year), day(eve), day(new_year), week(new_year)];
    want.sort();
    assert_eq!(left, want);
    shard.check().unwrap();
}

/// Deleting an expired period a little at a time must survive a restart:
/// the keys not yet deleted must still be deleted afterwards.
#[test]
fn restart_during_expiry_does_not_leak_keys() {
    let dir = scratch_dir();
    let day1 = at(2026, 5, 31, 12, 0, 0);
    let day3 = at(2026, 6, 2, 0, 0, 0);
    let b = board(1, vec![Window::Daily], 1, Ties::Competition);
    let gone = window::tree_at(&b, Window::Daily, day1, 0).unwrap();

    let mut shard = open(dir.path(), day1);
    shard.write(&b, "ann", 5, Mode::Set, 1).unwrap();
    shard.write(&b, "bob", 6, Mode::Set, 2).unwrap();
    shard.commit().unwrap();
    shard.set_time(day3);
    assert_eq!(shard.expire(1).unwrap(), vec![gone]); // deletes one key of four
    shard.prepare_shutdown(std::time::Duration::from_secs(60)).unwrap(); // a clean shutdown checkpoints the trees
    drop(shard);

    let mut shard = open(dir.path(), day3);
    for _ in 0..10 {
        shard.expire(3).unwrap();
    }
    let left: Vec<_> =
        [shard.get(gone, "ann").unwrap(), shard.get(gone, "bob").unwrap()].into_iter().flatten().collect();
    assert!(left.is_empty(), "expired {gone:?} still stores players {left:?}");
    assert!(listed(&shard, &b, gone).is_empty(), "expired {gone:?} still indexed: {:?}", listed(&shard, &b, gone));
    shard.check().unwrap();
}
