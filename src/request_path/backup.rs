//! `backup`: every shard's image, taken at one cut (see
//! [`Router::take_images`]), streamed to the client as frames (the format
//! is `rankd_client::BackupStream`'s). The images are read on a thread of
//! their own, at background priority, and handed over a few chunks at a
//! time, so a slow reader holds at most `CHUNKS_AHEAD` (4) chunks in memory
//! and never a shard's data.
//!
//! Metrics: outcomes in `rankd_requests_total{op="backup"}`; a backup that
//! took its images is timed in `rankd_backup_duration_seconds` (not the
//! request histogram, whose top bucket is 10 s), and its frames counted in
//! `rankd_backup_bytes_total` as they are written.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rankd_client::frame::write_frame_with;
use rankd_client::{BackupChunk, BackupHeader, BackupPart, BackupSummary, OpKind};
use rankd_shards::ShardImage;
use serde::Serialize;
use serde_bytes::ByteBuf;
use tokio::io::AsyncWrite;
use tokio::sync::{mpsc, watch};

use crate::error::Error;
use crate::operations::metrics::Metrics;
use crate::operations::priority;
use crate::protocol::encode_error;
use crate::request_path::router::Router;
use crate::request_path::transmit;
use crate::server::layout::FORMAT;

/// Bytes of keys and values a chunk gathers before it is sent: well under
/// a client's frame limit, large enough that framing costs nothing.
const CHUNK_BYTES: usize = 256 << 10;

/// Chunks encoded ahead of the connection's writes.
const CHUNKS_AHEAD: usize = 4;

/// Takes the images and streams them to `out` as request `id`'s answer.
/// A write that takes longer than `write_timeout` ends it (the reader
/// stopped); so does an error, sent as the last frame.
pub async fn stream<W: AsyncWrite + Unpin>(
    out: &mut W,
    id: u64,
    router: &Router,
    metrics: Arc<Metrics>,
    write_timeout: Duration,
    shutdown: &mut watch::Receiver<bool>,
) {
    let started = Instant::now();
    // One backup at a time: each holds a snapshot of every shard (old
    // versions kept from compaction) and a thread.
    let Some(_running) = Running::claim() else {
        let error = Error::Overloaded("a backup is already running; retry once it is done".into());
        return fail(out, id, &metrics, error, write_timeout).await;
    };
    let images = match router.take_images().await {
        Ok(images) => images,
        Err(error) => return fail(out, id, &metrics, error, write_timeout).await,
    };
    // From here on the backup is under way: timed whatever its outcome.
    let timed = |metrics: &Metrics| metrics.backup.duration.observe(started.elapsed().as_secs_f64());
    let (frames, mut next) = mpsc::channel(CHUNKS_AHEAD);
    // A backup only has to finish, not to be quick: it takes what the
    // request path leaves of the CPU.
    let spawned = std::thread::Builder::new().name("backup".into()).spawn(move || {
        priority::make_background("backup");
        encode(id, &images, &frames)
    });
    if let Err(e) = spawned {
        let error = Error::Internal(format!("starting the backup thread: {e}"));
        timed(&metrics);
        return fail(out, id, &metrics, error, write_timeout).await;
    }
    let mut outcome = Err(rankd_client::ErrorCode::Internal);
    loop {
        let (frame, last) = tokio::select! {
            frame = next.recv() => match frame {
                Some(frame) => frame,
                None => break,
            },
            // Shutdown does not wait for a backup: it ends with an error
            // frame, and dropping `next` stops the thread.
            _ = shutdown.changed() => {
                let error = Error::Overloaded("the server is shutting down; back up again after it restarts".into());
                timed(&metrics);
                return fail(out, id, &metrics, error, write_timeout).await;
            }
        };
        metrics.sent_bytes.inc_by(frame.len() as u64);
        if !transmit::send(out, &frame, write_timeout).await {
            break; // dropping `next` stops the thread
        }
        metrics.backup.bytes.inc_by(frame.len() as u64);
        if let Some(last) = last {
            outcome = last;
        }
    }
    timed(&metrics);
    metrics.op(Some(OpKind::Backup)).count(outcome);
}

/// The one backup running, released when dropped.
struct Running;

static RUNNING: AtomicBool = AtomicBool::new(false);

impl Running {
    fn claim() -> Option<Self> {
        (!RUNNING.swap(true, Ordering::AcqRel)).then_some(Running)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.store(false, Ordering::Release);
    }
}

/// Ends a backup with `error` as its last frame, counted as its outcome.
async fn fail<W: AsyncWrite + Unpin>(out: &mut W, id: u64, metrics: &Metrics, error: Error, write_timeout: Duration) {
    let mut frame = Vec::new();
    encode_error(&mut frame, id, &error);
    transmit::send(out, &frame, write_timeout).await;
    metrics.op(Some(OpKind::Backup)).count(Err(error.code()));
}

/// A frame, and for the last one the backup's outcome.
type Frame = (Vec<u8>, Option<Result<(), rankd_client::ErrorCode>>);

/// Encodes the header, every image's entries in chunks, then the summary
/// (or the error met) into frames for `frames`; stops early once the
/// connection is gone.
fn encode(id: u64, images: &[ShardImage], frames: &mpsc::Sender<Frame>) {
    let branching = images.first().map_or(0, ShardImage::branching);
    let header = BackupPart::Header(BackupHeader { format: FORMAT, shards: images.len(), branching });
    if frames.blocking_send((part_frame(id, &header), None)).is_err() {
        return;
    }
    let mut summary = BackupSummary { shards: images.len(), entries: 0, bytes: 0 };
    for (shard, image) in images.iter().enumerate() {
        let mut chunk = Chunk::default();
        for entry in image.entries() {
            let (keyspace, key, value) = match entry {
                Ok(entry) => entry,
                Err(error) => {
                    let error = Error::from(error);
                    let mut frame = Vec::new();
                    encode_error(&mut frame, id, &error);
                    let _ = frames.blocking_send((frame, Some(Err(error.code()))));
                    return;
                }
            };
            if chunk.keyspace != keyspace || chunk.bytes >= CHUNK_BYTES {
                if !chunk.send(id, shard, frames) {
                    return;
                }
                chunk.keyspace = keyspace;
            }
            summary.entries += 1;
            summary.bytes += (key.len() + value.len()) as u64;
            chunk.bytes += key.len() + value.len();
            chunk.entries.push((ByteBuf::from(key), ByteBuf::from(value)));
        }
        if !chunk.send(id, shard, frames) {
            return;
        }
    }
    #[derive(Serialize)]
    struct Done<'a> {
        id: u64,
        ok: &'a BackupSummary,
    }
    let _ = frames.blocking_send((framed(&Done { id, ok: &summary }), Some(Ok(()))));
}

/// Entries gathered for the next chunk frame.
#[derive(Default)]
struct Chunk {
    keyspace: &'static str,
    entries: Vec<(ByteBuf, ByteBuf)>,
    bytes: usize,
}

impl Chunk {
    /// Sends what was gathered, if anything; false once the connection is gone.
    fn send(&mut self, id: u64, shard: usize, frames: &mpsc::Sender<Frame>) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let chunk = BackupChunk { shard, keyspace: self.keyspace.into(), entries: std::mem::take(&mut self.entries) };
        self.bytes = 0;
        frames.blocking_send((part_frame(id, &BackupPart::Chunk(chunk)), None)).is_ok()
    }
}

fn part_frame(id: u64, part: &BackupPart) -> Vec<u8> {
    #[derive(Serialize)]
    struct PartFrame<'a> {
        id: u64,
        backup: &'a BackupPart,
    }
    framed(&PartFrame { id, backup: part })
}

fn framed<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    // Serializing these plain structs into a Vec cannot fail.
    write_frame_with(&mut out, |out| rmp_serde::encode::write_named(out, value).is_ok());
    out
}
