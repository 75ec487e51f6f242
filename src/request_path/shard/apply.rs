//! One command applied to a shard's engine.

use std::time::Duration;

use rankd_shards::Shard;

use super::command::{Command, Counts, Held, Ranked};
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
        Command::Write { board, player, score, mode, seq, reply } => {
            Some(Held::Score(reply, shard.write(&board, &player, score, mode, seq).map_err(Error::from)))
        }
        Command::WriteMany { board, entries, mode, reply } => {
            Some(Held::Scores(reply, shard.write_many(&board, &entries, mode).map_err(Error::from)))
        }
        Command::Remove { board, player, reply } => {
            Some(Held::Bool(reply, shard.remove(&board, &player).map_err(Error::from)))
        }
        Command::EnsureBoard { board, reply } => {
            shard.ensure_board(&board);
            Some(Held::Done(reply, Ok(())))
        }
        Command::DropBoard { board_id, reply } => {
            Some(Held::Bool(reply, shard.drop_board(board_id).map_err(Error::from)))
        }
        Command::Shutdown { reply } => {
            Some(Held::Done(reply, shard.prepare_shutdown(SHUTDOWN_FLUSH_WAIT).map_err(Error::from)))
        }
        Command::CheckIncr { board, entries, reply } => {
            let checked = shard.check_incr(&board, entries.iter().map(|(player, score)| (player.as_str(), *score)));
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
            let ranked = match shard.get(tree, &player) {
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
            let counts = Counts { before: shard.count_before(tree, &keys), total: shard.count(tree) };
            before_reply(shard);
            let _ = reply.send(Ok(counts));
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
