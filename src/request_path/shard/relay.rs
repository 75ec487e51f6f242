//! Hands committed answers to an I/O thread in one go.

use tokio::sync::mpsc;

use super::command::Held;

/// Carries a committed group's answers for one I/O thread to it in ONE
/// hand-off; a task there sends them on (one relay per I/O thread). Sent one by one from the
/// committer, each answer could wake that thread by itself, and the two
/// threads took turns preempting each other. Unbounded, but it only ever
/// holds answers to requests in flight, which the connections and the shard
/// queues bound.
#[derive(Clone)]
pub struct ReplyRelay(mpsc::UnboundedSender<(Vec<Held>, Option<String>)>);

impl ReplyRelay {
    /// The relay, and the task that delivers what it carries: spawn the task
    /// on the thread that awaits the answers.
    pub fn new() -> (Self, impl std::future::Future<Output = ()>) {
        let (sender, mut receiver) = mpsc::unbounded_channel::<(Vec<Held>, Option<String>)>();
        let deliver = async move {
            while let Some((answers, failure)) = receiver.recv().await {
                send_all(answers, failure.as_deref());
            }
        };
        (Self(sender), deliver)
    }

    /// Hands `answers` over, failed with `failure` if their commit failed;
    /// sends them from here if the delivering task is gone.
    pub fn relay(&self, answers: Vec<Held>, failure: Option<String>) {
        if let Err(mpsc::error::SendError((answers, failure))) = self.0.send((answers, failure)) {
            send_all(answers, failure.as_deref());
        }
    }
}

/// Sends held answers, failed with `failure` if given.
pub fn send_all(answers: impl IntoIterator<Item = Held>, failure: Option<&str>) {
    for held in answers {
        held.send(failure);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::request_path::shard::command::{answer, reply, Pending, Written};

    fn scores(values: &[i64]) -> (Vec<Held>, Vec<Pending<Written<i64>>>) {
        values
            .iter()
            .map(|&score| {
                let (sender, pending) = reply();
                (Held::Score(sender, Ok(Written::applied(score))), pending)
            })
            .unzip()
    }

    async fn received(pending: Vec<Pending<Written<i64>>>) -> Vec<Result<i64, Error>> {
        let mut out = Vec::new();
        for p in pending {
            out.push(answer(p).await.map(|w| w.value));
        }
        out
    }

    #[tokio::test]
    async fn relayed_answers_arrive_once_delivered_and_without_a_delivering_task() {
        let (relay, deliver) = ReplyRelay::new();
        let (held, mut pending) = scores(&[1, 2, 3]);
        relay.relay(held, None);
        // Nothing is sent until the delivering task runs.
        assert!(pending[0].try_recv().is_err());
        tokio::spawn(deliver);
        assert_eq!(received(pending).await, [Ok(1), Ok(2), Ok(3)]);

        let (relay, deliver) = ReplyRelay::new();
        drop(deliver);
        let (held, pending) = scores(&[4]);
        relay.relay(held, Some("fsync failed".into())); // the task is gone: sent from here
        assert_eq!(received(pending).await, [Err(Error::Internal("fsync failed".into()))]);
    }
}
