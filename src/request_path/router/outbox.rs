//! The first-round shard commands of one client batch, sent as ONE mailbox
//! message per shard.

use crate::request_path::shard::command::reply;
use crate::request_path::shard::{Command, Pending, Responder, ShardLink};

/// Gathered while the router routes a batch, then sent: one mailbox push
/// and at most one wake-up of each shard thread per batch, not per request.
/// Commands keep their order within each shard.
pub struct Outbox {
    per_shard: Vec<Vec<Command>>,
}

impl Outbox {
    /// An empty outbox for `shards` shards.
    pub fn new(shards: usize) -> Self {
        Self { per_shard: (0..shards).map(|_| Vec::new()).collect() }
    }

    /// Queues the command `make` builds around a new reply channel for
    /// `shard`; returns where its answer will arrive.
    pub fn ask<T>(&mut self, shard: usize, make: impl FnOnce(Responder<T>) -> Command) -> Pending<T> {
        let (sender, pending) = reply();
        self.push(shard, make(sender));
        pending
    }

    /// Queues a command already built for `shard`.
    pub fn push(&mut self, shard: usize, command: Command) {
        self.per_shard[shard].push(command);
    }

    /// Whether nothing is queued for any shard yet.
    pub fn is_empty(&self) -> bool {
        self.per_shard.iter().all(Vec::is_empty)
    }

    /// The same command for every shard, in shard order.
    pub fn ask_all<T>(&mut self, make: impl Fn(Responder<T>) -> Command) -> Vec<Pending<T>> {
        (0..self.per_shard.len()).map(|shard| self.ask(shard, &make)).collect()
    }

    /// Whether this batch holds nothing yet for any shard but `shard`. Then
    /// a command to `shard` may send on to the others itself (a rank's
    /// `Forward`) and still reach each of them after every earlier request
    /// of its connection: those of earlier batches were sent before this
    /// batch, and this one has none for them. (Later requests of the batch
    /// may land before it, as they may before a second round the router
    /// sends: a read concurrent with writes may reflect them.)
    pub fn holds_only_for(&self, shard: usize) -> bool {
        self.per_shard.iter().enumerate().all(|(i, commands)| i == shard || commands.is_empty())
    }

    /// Sends each shard its commands.
    pub fn send(mut self, links: &[ShardLink]) {
        self.flush(links);
    }

    /// Sends each shard the commands gathered so far, so that what is sent
    /// next reaches it after them.
    pub fn flush(&mut self, links: &[ShardLink]) {
        for (link, commands) in links.iter().zip(&mut self.per_shard) {
            if !commands.is_empty() {
                link.send(std::mem::take(commands));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rankd_shards::TreeId;

    fn count(reply: Responder<crate::request_path::shard::Counts>) -> Command {
        Command::CountBefore { tree: TreeId { board: 1, window: 0, period: 0 }, keys: Vec::new(), reply }
    }

    #[test]
    fn forwarding_is_safe_only_while_no_other_shard_has_a_command() {
        let mut outbox = Outbox::new(3);
        assert!((0..3).all(|shard| outbox.holds_only_for(shard)), "empty: any shard may forward");
        let _pending = outbox.ask(1, count);
        assert!(outbox.holds_only_for(1) && !outbox.holds_only_for(0) && !outbox.holds_only_for(2));
        let _all = outbox.ask_all(count);
        assert!((0..3).all(|shard| !outbox.holds_only_for(shard)));
        assert_eq!(outbox.per_shard.iter().map(Vec::len).collect::<Vec<_>>(), [1, 2, 1]);
    }
}
