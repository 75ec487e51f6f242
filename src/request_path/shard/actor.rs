//! The tree-shard actor: a thin actix shell over [`BatchLoop`]. It runs a
//! round once its mailbox is drained (a self-notified `Flush` is handled
//! only after every queued message) or the queue is full, steps leaf
//! repacking and an idle shard's checkpoint copy between requests, and
//! hears from the commit pipeline.

use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, AsyncContext, Context, Handler, Message};

use super::batch_loop::BatchLoop;
use super::link::ShardRequest;

/// The actor. Its state is the loop's; it only remembers which of its own
/// wake-ups are already in its mailbox.
pub struct ShardActor {
    core: BatchLoop,
    /// A [`Flush`] is in the mailbox.
    flush_scheduled: bool,
    /// A [`Repack`] is in the mailbox.
    repack_scheduled: bool,
    /// A [`CopyCheckpoint`] is in the mailbox.
    copy_scheduled: bool,
}

/// Sent to self so a round runs once the mailbox is drained.
struct Flush;

impl Message for Flush {
    type Result = ();
}

/// Sent to self while a leaf-repacking pass is under way: one step per
/// message, so steps queue behind requests and never hold a round up long.
struct Repack;

impl Message for Repack {
    type Result = ();
}

/// Sent to self while a checkpoint's copy waits and the shard is idle: one
/// step per message, as [`Repack`].
struct CopyCheckpoint;

/// How long a checkpoint's copy waits for its writer to catch up: a few
/// dozen small slices' writing.
const COPY_RETRY: Duration = Duration::from_millis(1);

impl Message for CopyCheckpoint {
    type Result = ();
}

/// From the pipeline's threads: a group's runs are written, or the
/// pipeline failed. Groups the committer finishes alone are not told: the
/// actor learns of them when it next looks.
struct CommitDone;

impl Message for CommitDone {
    type Result = ();
}

impl ShardActor {
    /// Wraps a batch loop.
    pub fn new(core: BatchLoop) -> Self {
        Self { core, flush_scheduled: false, repack_scheduled: false, copy_scheduled: false }
    }

    /// Queues the next repacking step and the next step of a checkpoint's
    /// copy, whichever waits and is not queued yet.
    fn schedule_steps(&mut self, ctx: &mut Context<Self>) {
        if self.repack_scheduled && self.copy_scheduled {
            return;
        }
        let waiting = self.core.steps_waiting();
        if waiting.repack && !self.repack_scheduled {
            self.repack_scheduled = true;
            ctx.notify(Repack);
        }
        if waiting.copy && !self.copy_scheduled {
            self.copy_scheduled = true;
            ctx.notify(CopyCheckpoint);
        }
    }

    fn run_round(&mut self, ctx: &mut Context<Self>) {
        self.core.run_round();
        self.schedule_steps(ctx);
    }
}

impl Actor for ShardActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // The actor runs on its own arbiter's thread from here on.
        self.core.metrics.threads.register(&format!("shard-{}", self.core.index));
        let actor = ctx.address();
        self.core.start_pipeline(Arc::new(move || actor.do_send(CommitDone)));
        // Idle shards still drop expired periods; busy ones do it between rounds.
        ctx.run_interval(Duration::from_secs(1), |actor, ctx| {
            actor.core.maintain();
            // A checkpoint begun by a seal off this thread (the committer's,
            // an in-place write's) has no round here to start its copy.
            actor.schedule_steps(ctx);
        });
    }

    fn stopping(&mut self, _: &mut Self::Context) -> actix::Running {
        self.core.stop();
        actix::Running::Stop
    }
}

impl Handler<ShardRequest> for ShardActor {
    type Result = ();

    fn handle(&mut self, ShardRequest { origin, commands }: ShardRequest, ctx: &mut Self::Context) {
        if self.core.enqueue(origin, commands) {
            self.run_round(ctx);
        } else if !self.flush_scheduled {
            self.flush_scheduled = true;
            ctx.notify(Flush);
        }
    }
}

impl Handler<Flush> for ShardActor {
    type Result = ();

    fn handle(&mut self, _: Flush, ctx: &mut Self::Context) {
        self.flush_scheduled = false;
        if self.core.has_queued() {
            self.run_round(ctx);
        }
    }
}

impl Handler<Repack> for ShardActor {
    type Result = ();

    fn handle(&mut self, _: Repack, ctx: &mut Self::Context) {
        self.repack_scheduled = false;
        self.core.repack_step();
        self.schedule_steps(ctx);
    }
}

impl Handler<CopyCheckpoint> for ShardActor {
    type Result = ();

    fn handle(&mut self, _: CopyCheckpoint, ctx: &mut Self::Context) {
        self.copy_scheduled = false;
        if self.core.checkpoint_copy_step() {
            self.schedule_steps(ctx);
        } else if self.core.steps_waiting().copy {
            // The writer is behind, or requests came: look again shortly
            // (rounds copy their own slices meanwhile).
            self.copy_scheduled = true;
            ctx.notify_later(CopyCheckpoint, COPY_RETRY);
        }
    }
}

impl Handler<CommitDone> for ShardActor {
    type Result = ();

    fn handle(&mut self, _: CommitDone, ctx: &mut Self::Context) {
        self.core.on_commit_progress();
        // A batch sealed here may have begun a checkpoint (its copy waits)
        // or finished one, which starts a repacking pass: an idle shard
        // must not leave either waiting.
        self.schedule_steps(ctx);
    }
}
