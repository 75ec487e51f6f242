//! Background load for tests that need a busy server: connections writing
//! one `set` at a time, without a pause, until told to stop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rankd_client::Mode;
use tokio::task::JoinHandle;

use super::Server;

/// Writers started by [`lone_writers`].
pub struct LoneWriters {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<(u64, u64)>>,
}

/// `connections` connections, each writing one `set` at a time to `board`
/// (its own 100 players, in turn) until [`LoneWriters::stop`].
pub async fn lone_writers(server: &Server, connections: usize, board: &str) -> LoneWriters {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::with_capacity(connections);
    for w in 0..connections {
        let (mut client, stop, board) = (server.client().await, stop.clone(), board.to_string());
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut refused) = (0, 0);
            for i in 0u64.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                match client.set(&board, &format!("w{w}-{}", i % 100), i as i64, Mode::Set).await {
                    Ok(_) => ok += 1,
                    Err(_) => refused += 1,
                }
            }
            (ok, refused)
        }));
    }
    LoneWriters { stop, tasks }
}

impl LoneWriters {
    /// Stops them; returns the writes answered and refused, over all.
    pub async fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let mut total = (0, 0);
        for task in self.tasks {
            let (ok, refused) = task.await.expect("a writer");
            total = (total.0 + ok, total.1 + refused);
        }
        total
    }
}
