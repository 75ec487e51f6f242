//! The server's side of a shard's commit pipeline: metrics, and answers
//! handed to the connections' thread.

use std::sync::Arc;

use rankd_shards::commit::{CommitError, CommitEvent, CommitHooks, PipelineThread};

use super::command::Held;
use super::relay::{send_all, ReplyRelay};
use crate::operations::metrics::Metrics;
use crate::operations::priority;

/// One shard's pipeline hooks.
pub struct ShardCommitHooks {
    pub metrics: Arc<Metrics>,
    /// This shard's index in `metrics.shards`.
    pub index: usize,
    /// Where answers go; without one, the committer sends them itself.
    pub relay: Option<ReplyRelay>,
}

impl CommitHooks<Vec<Held>> for ShardCommitHooks {
    fn thread_started(&self, thread: PipelineThread) {
        match thread {
            PipelineThread::Committer => self.metrics.threads.register(&format!("commit-{}", self.index)),
            PipelineThread::Runs => {
                self.metrics.threads.register(&format!("runs-{}", self.index));
                priority::make_background("runs");
            }
        }
    }

    fn acknowledge(&self, acks: Vec<Vec<Held>>, failure: Option<&CommitError>) {
        let answers: Vec<Held> = acks.into_iter().flatten().collect();
        self.metrics.shards[self.index].mailbox_depth.sub(answers.len() as i64);
        let failure = failure.map(ToString::to_string);
        match &self.relay {
            Some(relay) => relay.relay(answers, failure),
            None => send_all(answers, failure.as_deref()),
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
            CommitEvent::Failed => {
                metrics.commit_errors.inc();
                metrics.degraded.set(1);
            }
            CommitEvent::RunsWritten { took, checkpoint } => {
                metrics.run_seconds.observe(took.as_secs_f64());
                if checkpoint {
                    metrics.checkpoints.inc();
                }
            }
        }
    }
}
