//! What a shard is asked to do. Each command carries the typed channel its
//! answer goes back on, so an answer of the wrong kind does not compile.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rankd_shards::{
    Amount, Direction, ListEntry, Mode, Order, Record, Shard, ShardImage, SharedBoard, Ties, TreeId, Upcoming,
    UpcomingWrite, Wid,
};
use tokio::sync::oneshot;

use super::link::ShardLink;
use crate::error::Error;

/// Where one command's answer goes.
pub type Responder<T> = oneshot::Sender<Result<T, Error>>;

/// Where the router awaits one command's answer.
pub type Pending<T> = oneshot::Receiver<Result<T, Error>>;

/// A new reply channel.
pub fn reply<T>() -> (Responder<T>, Pending<T>) {
    oneshot::channel()
}

/// Awaits an answer; a dropped channel means the shard stopped.
pub async fn answer<T>(pending: Pending<T>) -> Result<T, Error> {
    pending.await.map_err(|_| Error::Internal("shard stopped".into()))?
}

/// A write's answer, and whether it was replayed: its `wid` had been
/// applied already, so this request changed nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written<T> {
    /// What the write answered (the first time, when replayed).
    pub value: T,
    /// Whether it was replayed rather than applied.
    pub dup: bool,
}

impl<T> Written<T> {
    /// A write applied now.
    pub fn applied(value: T) -> Self {
        Self { value, dup: false }
    }
}

/// A shard's count of players before each of some keys, and its total.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Counts {
    /// Players ranked before each key, in key order.
    pub before: Vec<u64>,
    /// Players in the tree.
    pub total: u64,
}

impl Counts {
    /// `shard`'s counts before `keys` in `tree`, however the read reached it
    /// (queued to its actor or in place).
    pub fn read(shard: &Shard, tree: TreeId, keys: &[u128]) -> Self {
        Self { before: shard.count_before(tree, keys), total: shard.count(tree) }
    }
}

/// A player's record (if present) with this shard's count of players ranked
/// before it and its total (both 0 when absent): the owner's half of a rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranked {
    /// The player's record.
    pub record: Option<Record>,
    /// Players on this shard ranked before it.
    pub before: u64,
    /// Players on this shard.
    pub total: u64,
}

/// A shard's part of an approximate-rank summary (`Command::Buckets`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Buckets {
    /// Players ranked before each of the keys asked about, in key order.
    pub before: Vec<u64>,
    /// Players in the tree.
    pub total: u64,
    /// This shard's own bucket boundaries, for the next refresh to count at.
    pub bounds: Vec<u128>,
}

/// One thing a shard is asked to do. One enum, so all kinds keep their FIFO
/// order in one mailbox.
#[derive(Debug)]
pub enum Command {
    /// Stage a write, at most once per `wid`; answers the score stored.
    Write {
        board: SharedBoard,
        player: String,
        amount: Amount,
        mode: Mode,
        seq: u64,
        wid: Option<Wid>,
        reply: Responder<Written<i64>>,
    },
    /// Stage several writes, all or none, at most once per `wid`; answers
    /// the scores, in entry order.
    WriteMany {
        board: SharedBoard,
        entries: Vec<(String, Amount, u64)>,
        mode: Mode,
        wid: Option<Wid>,
        reply: Responder<Written<Vec<i64>>>,
    },
    /// Whether `incr`s of these entries would all stay in range (or were
    /// applied already under `wid`); stages nothing (a `set_many` spanning
    /// shards asks each shard first).
    CheckIncr { board: SharedBoard, entries: Vec<(String, Amount)>, wid: Option<Wid>, reply: Responder<()> },
    /// Stage a removal, at most once per `wid`; answers whether the player
    /// was there.
    Remove { board: SharedBoard, player: String, wid: Option<Wid>, reply: Responder<Written<bool>> },
    /// Persist a board's config.
    EnsureBoard { board: SharedBoard, reply: Responder<()> },
    /// Delete a board; answers whether it held anything here.
    DropBoard { board_id: u64, reply: Responder<bool> },
    /// A player's record.
    Get { tree: TreeId, player: String, reply: Responder<Option<Record>> },
    /// The owner's half of a rank, in the round that finds the score. On S
    /// shards the other S-1 count too, asked by the owner itself when
    /// `forward` names them, else by the router once this answer is back.
    Rank { tree: TreeId, player: String, ties: Ties, order: Order, forward: Forward, reply: Responder<Ranked> },
    /// Players before each key and in total.
    CountBefore { tree: TreeId, keys: Vec<u128>, reply: Responder<Counts> },
    /// An approximate-rank summary's round: the players before each of
    /// `keys` (ascending, the same for every shard) and in total, and this
    /// shard's own bucket bounds: about `buckets` buckets of equal counts,
    /// split within a score only when `split_ties` (see
    /// `TreeView::bucket_bounds`).
    Buckets { tree: TreeId, keys: Arc<[u128]>, buckets: usize, split_ties: bool, reply: Responder<Buckets> },
    /// Inside one crowded tree key of a competition or dense tree: the
    /// players of the group `path` leads to (`rankd_shards::ties`) whose
    /// next name chunk is below each pivot (`before`), for a deep `top`.
    TieCounts { tree: TreeId, key: u128, path: Vec<u128>, pivots: Vec<u128>, reply: Responder<Vec<u64>> },
    /// A slice of the list order.
    List {
        tree: TreeId,
        ties: Ties,
        order: Order,
        position: Vec<u8>,
        direction: Direction,
        limit: usize,
        reply: Responder<Vec<ListEntry>>,
    },
    /// Commit everything before this and prepare a fast restart (checkpoint
    /// the trees, flush the memtables).
    Shutdown { reply: Responder<()> },
    /// Answered once everything this shard did before it is durable: what
    /// a watch waits for before it pushes what it read.
    Fence { reply: Responder<()> },
    /// An image of everything committed, taken once every earlier write is
    /// (see `Shard::image`): one shard's part of a backup.
    Image { reply: Responder<ShardImage> },
}

impl Command {
    /// Commands that change what is stored: refused while the shard's
    /// storage is failing, answered only once durable.
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Self::Write { .. }
                | Self::WriteMany { .. }
                | Self::Remove { .. }
                | Self::EnsureBoard { .. }
                | Self::DropBoard { .. }
                | Self::Fence { .. }
        )
    }

    /// Maintenance that scans or rewrites storage needs every earlier write
    /// committed and its runs written first. (Lists do not: they read
    /// storage under the overlays of everything unwritten.)
    pub fn needs_committed_state(&self) -> bool {
        matches!(self, Self::DropBoard { .. } | Self::Shutdown { .. } | Self::Image { .. })
    }

    /// What the command will touch, for the round's look-ahead prefetch.
    pub fn upcoming(&self) -> Option<Upcoming<'_>> {
        match self {
            Self::Write { board, player, amount, mode, seq, .. } => {
                Some(Upcoming::Write(UpcomingWrite { board, player, amount: *amount, mode: *mode, seq: *seq }))
            }
            Self::Rank { tree, player, ties, order, .. } => {
                Some(Upcoming::Rank { tree: *tree, player, ties: *ties, order: *order })
            }
            Self::CountBefore { tree, keys, .. } => Some(Upcoming::CountBefore { tree: *tree, keys }),
            _ => None,
        }
    }

    /// Answers the command with `error` without doing it (overload, a
    /// closed shard).
    pub fn refuse(self, error: Error) {
        match self {
            Self::Write { reply, .. } => drop(reply.send(Err(error))),
            Self::WriteMany { reply, .. } => drop(reply.send(Err(error))),
            Self::Remove { reply, .. } => drop(reply.send(Err(error))),
            Self::DropBoard { reply, .. } => drop(reply.send(Err(error))),
            Self::EnsureBoard { reply, .. } | Self::Shutdown { reply } | Self::Fence { reply } => {
                drop(reply.send(Err(error)))
            }
            Self::Get { reply, .. } => drop(reply.send(Err(error))),
            Self::CheckIncr { reply, .. } => drop(reply.send(Err(error))),
            Self::Rank { reply, .. } => drop(reply.send(Err(error))),
            Self::CountBefore { reply, .. } => drop(reply.send(Err(error))),
            Self::List { reply, .. } => drop(reply.send(Err(error))),
            Self::TieCounts { reply, .. } => drop(reply.send(Err(error))),
            Self::Buckets { reply, .. } => drop(reply.send(Err(error))),
            Self::Image { reply } => drop(reply.send(Err(error))),
        }
    }
}

/// The other shards a rank's owner asks for their counts before the
/// player's rank key, each with the channel the router awaits that count
/// on. The owner sends them on as soon as it has the record: one hop
/// (owner to the other shard) where asking through the router took two,
/// each a thread wake-up. Without a record (or when its lookup fails) the
/// channels are dropped, and the router takes the owner's answer. Empty:
/// the router asks them itself.
#[derive(Default)]
pub struct Forward(pub Vec<(ShardLink, Responder<Counts>)>);

impl Forward {
    /// Gets each shard's count before `key` in `tree`: read in place when
    /// its engine is free (as a lone rank reads it), else queued to its
    /// actor. A queued count keeps that actor's lock busy for the ranks in
    /// place behind it, so one rank that had to queue would make the next
    /// likelier to queue too. Never in place while a command sent to that
    /// shard is unapplied, and never without the writes waiting for its
    /// committer: either may be a write the rank's connection sent before
    /// the rank, which the count must see.
    pub fn send(self, tree: TreeId, key: u128) {
        for (link, reply) in self.0 {
            let behind_nothing = link.engine.unapplied().load(Ordering::Acquire) == 0;
            let counted = if behind_nothing {
                link.engine.try_read_applied(|shard| Counts::read(shard, tree, std::slice::from_ref(&key)))
            } else {
                None
            };
            match counted {
                Some(counts) => drop(reply.send(Ok(counts))),
                None => link.send(vec![Command::CountBefore { tree, keys: vec![key], reply }]),
            }
        }
    }
}

impl std::fmt::Debug for Forward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Forward(to {} shards)", self.0.len())
    }
}

/// A write's answer, computed when it was staged, held until its batch is
/// durable. Each variant pairs a reply channel with an answer of its type.
#[derive(Debug)]
pub enum Held {
    /// A `Write`'s.
    Score(Responder<Written<i64>>, Result<Written<i64>, Error>),
    /// A `WriteMany`'s.
    Scores(Responder<Written<Vec<i64>>>, Result<Written<Vec<i64>>, Error>),
    /// A `Remove`'s.
    Removed(Responder<Written<bool>>, Result<Written<bool>, Error>),
    /// A `DropBoard`'s.
    Bool(Responder<bool>, Result<bool, Error>),
    /// An `EnsureBoard`'s or `Shutdown`'s.
    Done(Responder<()>, Result<(), Error>),
}

impl Held {
    /// Sends the answer once its batch is over: if the commit failed, a
    /// success becomes `internal` (it may or may not have applied); a
    /// refusal (which changed nothing) stays.
    pub fn send(self, failure: Option<&str>) {
        fn unless<T>(answer: Result<T, Error>, failure: Option<&str>) -> Result<T, Error> {
            match (failure, answer) {
                (Some(why), Ok(_)) => Err(Error::Internal(why.to_string())),
                (_, answer) => answer,
            }
        }
        match self {
            Self::Score(reply, answer) => drop(reply.send(unless(answer, failure))),
            Self::Scores(reply, answer) => drop(reply.send(unless(answer, failure))),
            Self::Removed(reply, answer) => drop(reply.send(unless(answer, failure))),
            Self::Bool(reply, answer) => drop(reply.send(unless(answer, failure))),
            Self::Done(reply, answer) => drop(reply.send(unless(answer, failure))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rankd_shards::Board;

    fn tree() -> TreeId {
        TreeId { board: 1, window: 0, period: 0 }
    }

    #[test]
    fn writes_wait_for_durability_and_maintenance_for_committed_state() {
        let board = SharedBoard::new(Board { id: 1, name: "b".into(), config: Default::default() });
        let write = Command::Write {
            board,
            player: "p".into(),
            amount: Amount::Score(1),
            mode: Mode::Set,
            seq: 1,
            wid: None,
            reply: reply().0,
        };
        let rank = Command::Rank {
            tree: tree(),
            player: "p".into(),
            ties: Ties::Competition,
            order: Order::Desc,
            forward: Forward::default(),
            reply: reply().0,
        };
        let drop_board = Command::DropBoard { board_id: 1, reply: reply().0 };
        let shutdown = Command::Shutdown { reply: reply().0 };
        assert!(write.is_write() && !write.needs_committed_state() && write.upcoming().is_some());
        assert!(!rank.is_write() && !rank.needs_committed_state() && rank.upcoming().is_some());
        assert!(drop_board.is_write() && drop_board.needs_committed_state());
        assert!(!shutdown.is_write() && shutdown.needs_committed_state());
    }

    #[tokio::test]
    async fn a_failed_commit_turns_successes_into_internal_and_keeps_refusals() {
        let (ok, ok_answer) = reply();
        let (refused, refused_answer) = reply::<Written<i64>>();
        Held::Score(ok, Ok(Written::applied(5))).send(Some("fsync failed"));
        Held::Score(refused, Err(Error::BadRequest("overflow".into()))).send(Some("fsync failed"));
        assert_eq!(answer(ok_answer).await, Err(Error::Internal("fsync failed".into())));
        assert_eq!(answer(refused_answer).await, Err(Error::BadRequest("overflow".into())));
        let (done, done_answer) = reply();
        Held::Done(done, Ok(())).send(None);
        assert_eq!(answer(done_answer).await, Ok(()));
        let (count, count_answer) = reply::<Counts>();
        Command::CountBefore { tree: tree(), keys: vec![], reply: count }.refuse(Error::Overloaded("full".into()));
        assert_eq!(answer(count_answer).await, Err(Error::Overloaded("full".into())));
    }
}
