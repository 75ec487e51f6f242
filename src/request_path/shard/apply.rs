//! One command applied to a shard's engine.

use std::time::Duration;

use rankd_shards::tree::BucketShape;
use rankd_shards::{Outcome, Shard, ShardError, Wid};

use super::command::{Buckets, Command, Counts, Held, Ranked, Written};
use crate::error::Error;

/// How long a shutdown waits for the memtables to be flushed; past it the
/// process exits anyway and the next start replays the journal (slower, but
/// nothing is lost). Well inside the 30 s an orchestrator usually grants
/// between SIGTERM and SIGKILL.
const SHUTDOWN_FLUSH_WAIT: Duration = Duration::from_secs(20);

/// Applies `command` to `shard`. A read is answered here, after `before_reply`
/// (which counts it); a write is staged and its answer returned, to be
/// held until its batch is durable.
pub fn apply(shard: &mut Shard, command: Command, before_reply: &mut dyn FnMut(&mut Shard)) -> Option<Held> {
    match command {
        Command::Write { board, player, amount, mode, seq, wid, reply } => {
            let written = once(shard, board.id, wid, |shard| shard.write_amount(&board, &player, amount, mode, seq));
            Some(Held::Score(reply, written))
        }
        Command::WriteMany { board, entries, mode, wid, reply } => {
            let written = once(shard, board.id, wid, |shard| shard.write_many(&board, &entries, mode));
            Some(Held::Scores(reply, written))
        }
        Command::Remove { board, player, wid, reply } => {
            let written = once(shard, board.id, wid, |shard| shard.remove(&board, &player));
            Some(Held::Removed(reply, written))
        }
        Command::EnsureBoard { board, reply } => {
            shard.ensure_board(&board);
            Some(Held::Done(reply, Ok(())))
        }
        Command::DropBoard { board_id, reply } => {
            Some(Held::Bool(reply, shard.drop_board(board_id).map_err(Error::from)))
        }
        // Held like a write that changed nothing: answered with its batch.
        Command::Fence { reply } => Some(Held::Done(reply, Ok(()))),
        Command::Shutdown { reply } => {
            Some(Held::Done(reply, shard.prepare_shutdown(SHUTDOWN_FLUSH_WAIT).map_err(Error::from)))
        }
        Command::Image { reply } => {
            let image = shard.image().map_err(Error::from);
            before_reply(shard);
            let _ = reply.send(image);
            None
        }
        Command::CheckIncr { board, entries, wid, reply } => {
            // A part applied already is replayed, not applied again.
            let replayed = wid.is_some_and(|wid| shard.applied(board.id, &wid).is_some());
            let checked = match replayed {
                true => Ok(()),
                false => shard.check_incr(&board, entries.iter().map(|(player, amount)| (player.as_str(), *amount))),
            };
            before_reply(shard);
            let _ = reply.send(checked.map_err(Error::from));
            None
        }
        Command::Get { tree, player, reply } => {
            let record = shard.get(tree, &player).map_err(Error::from);
            before_reply(shard);
            let _ = reply.send(record);
            None
        }
        Command::Rank { tree, player, ties, order, forward, reply } => {
            let ranked = match shard.rank_record(tree, &player) {
                Ok(Some(record)) => {
                    let key = record.rank_key(ties, order);
                    forward.send(tree, key); // first, so the others count while this one does
                    let before = shard.count_before_key(tree, key);
                    Ok(Ranked { record: Some(record), before, total: shard.count(tree) })
                }
                Ok(None) => Ok(Ranked { record: None, before: 0, total: 0 }),
                Err(e) => Err(Error::from(e)),
            };
            before_reply(shard);
            let _ = reply.send(ranked);
            None
        }
        Command::CountBefore { tree, keys, reply } => {
            let counts = Counts::read(shard, tree, &keys);
            before_reply(shard);
            let _ = reply.send(Ok(counts));
            None
        }
        Command::Buckets { tree, keys, buckets, split_ties, reply } => {
            let total = shard.count(tree);
            let per_bucket = total.div_ceil(buckets.max(1) as u64);
            let shape = BucketShape { per_bucket, max_buckets: 8 * buckets, split_ties };
            let answer = Buckets {
                before: shard.count_before_sorted(tree, &keys),
                total,
                bounds: shard.bucket_bounds(tree, shape),
            };
            before_reply(shard);
            let _ = reply.send(Ok(answer));
            None
        }
        Command::TieCounts { tree, key, path, pivots, reply } => {
            let counts = shard.tie_counts(tree, key, &path, &pivots).map_err(Error::from);
            before_reply(shard);
            let _ = reply.send(counts);
            None
        }
        Command::List { tree, ties, order, position, direction, limit, reply } => {
            let list = shard.list(tree, ties, order, &position, direction, limit).map_err(Error::from);
            before_reply(shard);
            let _ = reply.send(list);
            None
        }
    }
}

/// What a write's answer is recorded as, and read back from a record.
trait Recorded: Sized {
    fn outcome(&self) -> Outcome;
    fn replayed(outcome: &Outcome) -> Option<Self>;
}

impl Recorded for i64 {
    fn outcome(&self) -> Outcome {
        Outcome::Score(*self)
    }
    fn replayed(outcome: &Outcome) -> Option<Self> {
        match outcome {
            Outcome::Score(score) => Some(*score),
            _ => None,
        }
    }
}

impl Recorded for Vec<i64> {
    fn outcome(&self) -> Outcome {
        Outcome::Scores(self.clone())
    }
    fn replayed(outcome: &Outcome) -> Option<Self> {
        match outcome {
            Outcome::Scores(scores) => Some(scores.clone()),
            _ => None,
        }
    }
}

impl Recorded for bool {
    fn outcome(&self) -> Outcome {
        Outcome::Removed(*self)
    }
    fn replayed(outcome: &Outcome) -> Option<Self> {
        match outcome {
            Outcome::Removed(removed) => Some(*removed),
            _ => None,
        }
    }
}

/// Applies a write at most once per `wid` on its board: a `wid` this
/// shard applied already answers its first outcome and changes nothing;
/// else the write is staged and, if it succeeded, its outcome recorded in
/// the same batch. A refused write records nothing (it changed nothing, and
/// a retry is refused again or applies).
fn once<T: Recorded>(
    shard: &mut Shard,
    board: u64,
    wid: Option<Wid>,
    write: impl FnOnce(&mut Shard) -> Result<T, ShardError>,
) -> Result<Written<T>, Error> {
    let Some(wid) = wid else { return write(shard).map(Written::applied).map_err(Error::from) };
    if let Some(first) = shard.applied(board, &wid) {
        return T::replayed(first).map(|value| Written { value, dup: true }).ok_or_else(|| {
            Error::BadRequest(format!("`wid` {:?} was used by a `{}` on this board", wid.as_str(), first.kind()))
        });
    }
    let value = write(shard)?;
    shard.record_applied(board, wid, value.outcome());
    Ok(Written::applied(value))
}
