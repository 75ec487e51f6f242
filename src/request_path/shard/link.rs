//! How the router (and a rank's owner) reach a shard.

use actix::{Addr, Message};

use super::actor::ShardActor;
use super::command::{reply, Command, Pending, Responder};
use super::engine_cell::EngineCell;
use crate::error::Error;

/// Which I/O thread a command came from: the answers a commit holds go back
/// to each thread in one hand-off (see `relay.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Origin(pub u16);

/// One mailbox message: the commands a router batch has for this shard, in
/// order. Batching them makes a pipeline cost one mailbox push per shard.
pub struct ShardRequest {
    /// The I/O thread whose router sent them.
    pub origin: Origin,
    /// The commands, in order.
    pub commands: Vec<Command>,
}

impl Message for ShardRequest {
    type Result = ();
}

/// A shard's address, and the count of commands sent to it and not yet
/// answered (raised here, lowered as they are answered; it is also the
/// `rankd_shard_mailbox_depth` gauge).
///
/// The count is the mailbox bound: actix 0.13 enforces no capacity on
/// `do_send` (actix issue #329), so a link refuses work past `max_queue` and
/// answers it `overloaded` at once instead of queueing without limit.
#[derive(Clone)]
pub struct ShardLink {
    /// The actor.
    pub addr: Addr<ShardActor>,
    /// Commands queued, in the current round, or held until their batch
    /// is durable.
    pub depth: prometheus::IntGauge,
    /// Most commands that may be queued.
    pub max_queue: usize,
    /// The actor's engine, read (lone ranks) and written (lone writes) in place.
    pub engine: EngineCell,
    /// The I/O thread this link's holder runs on.
    pub origin: Origin,
}

impl ShardLink {
    /// Enqueues the command `make` builds around a new reply channel, now,
    /// and returns where its answer will arrive.
    pub fn ask<T>(&self, make: impl FnOnce(Responder<T>) -> Command) -> Pending<T> {
        let (sender, pending) = reply();
        self.send(vec![make(sender)]);
        pending
    }

    /// Stages a lone write in place (see [`EngineCell::try_write`]) or, if
    /// it may not be, gives it back to be queued.
    pub fn try_write(&self, command: Command) -> Result<(), Command> {
        self.engine.try_write(self.origin, command)
    }

    /// [`ShardLink::ask`] past the queue's bound: for the server's own work
    /// that must not be shed (a summary's refresh, one command a shard per
    /// interval, each awaited before the next).
    pub fn ask_unbounded<T>(&self, make: impl FnOnce(Responder<T>) -> Command) -> Pending<T> {
        let (sender, pending) = reply();
        self.send_unbounded(vec![make(sender)]);
        pending
    }

    /// Enqueues several commands as one mailbox message, or answers them all
    /// `overloaded` if the shard's queue is full.
    pub fn send(&self, commands: Vec<Command>) {
        let queued = usize::try_from(self.depth.get()).unwrap_or(0);
        if queued + commands.len() > self.max_queue {
            for command in commands {
                command.refuse(Error::Overloaded(format!(
                    "shard has {queued} commands queued (limit {}); retry later",
                    self.max_queue
                )));
            }
            return;
        }
        self.send_unbounded(commands);
    }

    /// Enqueues regardless of the bound: for control commands (shutdown)
    /// that must never be shed.
    pub fn send_unbounded(&self, commands: Vec<Command>) {
        self.depth.add(commands.len() as i64);
        self.engine.unapplied().fetch_add(commands.len(), std::sync::atomic::Ordering::AcqRel);
        self.addr.do_send(ShardRequest { origin: self.origin, commands });
    }

    /// The same shard, reached from the I/O thread `origin`.
    pub fn from(&self, origin: Origin) -> Self {
        Self { origin, ..self.clone() }
    }
}
