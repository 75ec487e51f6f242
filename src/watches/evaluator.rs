//! The evaluator: the one task that reads what due watches follow and
//! offers the values to the registry, on a thread of its own so it never
//! runs in a shard's round or on a connection's thread.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix::Addr;
use rankd_client::Entry;
use serde::Serialize;

use super::registry::{Group, Offered};
use super::{push_frame, WatchHub};
use crate::error::Error;
use crate::protocol::request::WatchTarget;
use crate::protocol::score::FieldScore;
use crate::protocol::{Op, Reply};
use crate::request_path::router::{Dispatch, Fence, RouterActor};

/// How long a look that failed (a shard refusing writes, so its fence too)
/// waits before the watches it held are looked at again.
const RETRY_AFTER: Duration = Duration::from_millis(200);

/// The longest the evaluator sleeps towards a period boundary before it
/// reads the clock again: a wall clock stepped meanwhile delays a
/// rollover's pushes by no more than this.
const CLOCK_CHECK: Duration = Duration::from_secs(60);

/// Runs until the process ends: waits for due watches, looks, offers.
pub async fn run(hub: Arc<WatchHub>, router: Addr<RouterActor>) {
    loop {
        let started = Instant::now();
        let unix_seconds = hub.clock.now();
        let (groups, next, boundary) = {
            let mut registry = hub.registry.lock();
            let boundary = registry.roll(unix_seconds);
            let (groups, next) = registry.take_due(Instant::now());
            (groups, next, boundary)
        };
        if groups.is_empty() {
            let rollover = reaching(boundary, unix_seconds);
            let at = next.map_or(rollover, |next| next.min(rollover));
            tokio::select! {
                () = hub.wake.notified() => {}
                () = tokio::time::sleep_until(at.into()) => {}
            }
            continue;
        }
        if let Err(error) = look(&hub, &router, &groups).await {
            tracing::warn!(%error, "reading watched boards failed; retrying");
            hub.registry.lock().retry(groups.iter().flat_map(|g| g.watches.iter().map(|(key, _)| *key)));
            tokio::time::sleep(RETRY_AFTER).await;
            continue;
        }
        hub.metrics.watches.look_seconds.observe(started.elapsed().as_secs_f64());
    }
}

/// About when a clock that read `unix_seconds` reads `boundary`, at most
/// [`CLOCK_CHECK`] away. It reads whole seconds, so the fraction of the
/// current one has gone already; waking early only means reading it again.
fn reaching(boundary: i64, unix_seconds: i64) -> Instant {
    let into_second = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.subsec_nanos());
    let ahead = Duration::from_secs(u64::try_from(boundary - unix_seconds).unwrap_or(0))
        .saturating_sub(Duration::from_nanos(into_second.into()));
    Instant::now() + ahead.min(CLOCK_CHECK)
}

/// Reads every group's values in one batch, waits until all the shards
/// have made durable everything the reads could have seen, then offers
/// each watch its value.
async fn look(hub: &WatchHub, router: &Addr<RouterActor>, groups: &[Group]) -> Result<(), Error> {
    let stopped = |_| Error::Internal("router stopped".into());
    let mut ops = Vec::new();
    for group in groups {
        let (board, view) = (group.board.clone(), group.view);
        if group.top > 0 {
            ops.push(Op::Top { board: board.clone(), limit: group.top, offset: 0, view });
        }
        ops.extend(group.players.iter().map(|player| Op::Rank { board: board.clone(), player: player.clone(), view }));
    }
    let mut replies = router.send(Dispatch(ops)).await.map_err(stopped)?.into_iter();
    // Reads may see writes staged but not yet durable; none of those may be
    // pushed before it is.
    router.send(Fence).await.map_err(stopped)??;
    hub.metrics.watches.looks.inc();
    let now = Instant::now();
    // Watches whose view their board refuses (a window or period it does
    // not have: watched before the board was made, or made again without
    // it). Theirs alone end; the others are offered what was read.
    let mut unreadable = Vec::new();
    for group in groups {
        let reads = usize::from(group.top > 0) + group.players.len();
        let answers: Vec<Result<Reply, Error>> = replies.by_ref().take(reads).collect();
        if answers.iter().any(|answer| matches!(answer, Err(Error::BadRequest(_)))) {
            unreadable.extend(group.watches.iter().map(|(key, _)| *key));
            continue;
        }
        let mut answers = answers.into_iter();
        let top = match group.top {
            0 => Rows::Plain(Vec::new()),
            _ => match answers.next() {
                Some(Ok(Reply::Entries(entries))) => Rows::Plain(entries),
                Some(Ok(Reply::FieldEntries(entries))) => Rows::Fields(entries),
                other => return Err(unexpected(other)),
            },
        };
        let mut ranks: Vec<(&str, Vec<u8>)> = Vec::with_capacity(group.players.len());
        for player in &group.players {
            let rank = match answers.next() {
                Some(Ok(Reply::Rank(rank))) => encode(&rank),
                Some(Ok(Reply::FieldRank(rank))) => encode(&rank),
                other => return Err(unexpected(other)),
            };
            ranks.push((player, rank));
        }
        // Watches of one length of top share one encoding.
        let mut tops: Vec<(usize, Vec<u8>)> = Vec::new();
        let mut registry = hub.registry.lock();
        for (key, target) in &group.watches {
            let event = match target {
                WatchTarget::Top(n) => {
                    if !tops.iter().any(|(len, _)| len == n) {
                        tops.push((*n, top.encode_first(*n)));
                    }
                    tops.iter().find(|(len, _)| len == n).map(|(_, event)| event)
                }
                WatchTarget::Player(player) => ranks.iter().find(|(p, _)| p == player).map(|(_, event)| event),
            };
            let Some(event) = event else { continue };
            match registry.offer(*key, event, || push_frame(key.watch, event), now) {
                Offered::Pushed { coalesced } => {
                    hub.metrics.watches.pushes.inc();
                    hub.metrics.watches.coalesced.inc_by(u64::from(coalesced));
                }
                // The push it withdrew was counted and is never written:
                // counted as coalesced too, like one replaced.
                Offered::Withdrawn => hub.metrics.watches.coalesced.inc(),
                Offered::Unchanged | Offered::Gone | Offered::Withheld => {}
            }
        }
    }
    if !unreadable.is_empty() {
        hub.unreadable(unreadable);
    }
    Ok(())
}

/// A watched top's rows: scores as integers, or as maps on a board with
/// fields.
enum Rows {
    Plain(Vec<Entry>),
    Fields(Vec<Entry<FieldScore>>),
}

impl Rows {
    /// The best `n` rows, encoded as a push's value.
    fn encode_first(&self, n: usize) -> Vec<u8> {
        match self {
            Self::Plain(rows) => encode(&rows[..rows.len().min(n)]),
            Self::Fields(rows) => encode(&rows[..rows.len().min(n)]),
        }
    }
}

fn encode<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    // Serializing plain structs into a Vec cannot fail.
    let _ = rmp_serde::encode::write_named(&mut out, value);
    out
}

fn unexpected(reply: Option<Result<Reply, Error>>) -> Error {
    match reply {
        Some(Err(error)) => error,
        other => Error::Internal(format!("a watch's read answered {other:?}")),
    }
}
