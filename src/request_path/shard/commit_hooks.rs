//! The server's side of a shard's commit pipeline: metrics, and answers
//! handed to the I/O threads.

use std::sync::Arc;

use rankd_shards::commit::{CommitError, CommitEvent, CommitHooks, PipelineThread};

use super::command::Held;
use super::engine_cell::WeakEngineCell;
use super::link::Origin;
use super::relay::{send_all, ReplyRelay};
use crate::operations::metrics::Metrics;
use crate::operations::priority;

/// One shard's pipeline hooks.
pub struct ShardCommitHooks {
    pub metrics: Arc<Metrics>,
    /// This shard's index in `metrics.shards`.
    pub index: usize,
    /// Where answers go, one relay per I/O thread; without them, the
    /// committer sends them itself.
    pub relays: Vec<ReplyRelay>,
    /// The shard's engine, whose waiting writes the committer applies
    /// before it answers a group.
    pub engine: WeakEngineCell,
}

impl CommitHooks<Vec<(Origin, Held)>> for ShardCommitHooks {
    fn thread_started(&self, thread: PipelineThread) {
        match thread {
            PipelineThread::Committer => self.metrics.threads.register(&format!("commit-{}", self.index)),
            PipelineThread::Runs => {
                self.metrics.threads.register(&format!("runs-{}", self.index));
                priority::make_background("runs");
            }
        }
    }

    fn before_acknowledge(&self) {
        self.engine.apply_waiting();
    }

    fn acknowledge(&self, acks: Vec<Vec<(Origin, Held)>>, failure: Option<&CommitError>) {
        let answers: Vec<(Origin, Held)> = acks.into_iter().flatten().collect();
        // Lowered first, so a client that sees its answer sees it counted.
        self.metrics.shards[self.index].mailbox_depth.sub(answers.len() as i64);
        let failure = failure.map(ToString::to_string);
        if self.relays.is_empty() {
            send_all(answers.into_iter().map(|(_, held)| held), failure.as_deref());
            return;
        }
        // One hand-off per I/O thread that has answers in the group.
        let mut by_thread: Vec<Vec<Held>> = self.relays.iter().map(|_| Vec::new()).collect();
        for (Origin(thread), held) in answers {
            let slot = usize::from(thread).min(by_thread.len() - 1);
            by_thread[slot].push(held);
        }
        for (relay, answers) in self.relays.iter().zip(by_thread) {
            if !answers.is_empty() {
                relay.relay(answers, failure.clone());
            }
        }
    }

    fn observe(&self, event: CommitEvent) {
        let metrics = &self.metrics.shards[self.index];
        match event {
            CommitEvent::BatchWritten(took) => metrics.commit_seconds.observe(took.as_secs_f64()),
            CommitEvent::Synced { took, writes } => {
                metrics.fsync_seconds.observe(took.as_secs_f64());
                metrics.writes_applied.inc_by(writes as u64);
            }
            // Counted and shown where the shard takes the failure
            // (`Health::failed`), which also hears of those no event
            // reports: a pipeline thread's panic, a failed empty group.
            CommitEvent::Failed => {}
            CommitEvent::RunsWritten { took, checkpoint } => {
                metrics.run_seconds.observe(took.as_secs_f64());
                if checkpoint {
                    metrics.checkpoints.inc();
                }
            }
        }
    }
}
