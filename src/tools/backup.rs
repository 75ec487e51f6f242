//! `rankd backup --server ADDR --to DIR`: an online backup of a running
//! server into a new data dir that `rankd serve --data-dir DIR` opens
//! (restoring is starting on the copy).
//!
//! The server takes every shard's image at one cut and streams it
//! (`request_path::backup`); this side writes each shard's keyspaces
//! straight into tables on a thread of its own, and writes the layout
//! file last, so a copy that stopped part way never looks like a data dir.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};
use std::time::Instant;

use clap::Args;
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use rankd_client::{BackupChunk, BackupHeader, BackupPart, ClientError};
use rankd_shards::{ImageWriter, ShardError};

use crate::server::layout::{self, Layout, LayoutError, FORMAT};
use crate::tools::cli::ClientArgs;

/// Chunks received ahead of the writer thread.
const CHUNKS_AHEAD: usize = 4;

/// `rankd backup` flags.
#[derive(Debug, Clone, Args)]
pub struct BackupArgs {
    /// Server to back up (a `write` token's op on a server with tokens).
    #[command(flatten)]
    pub client: ClientArgs,
    /// The new data dir: must not exist, or be empty.
    #[arg(long)]
    pub to: PathBuf,
    /// No progress spinner.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// What a finished backup holds.
#[derive(Debug, Clone, Copy)]
pub struct BackupReport {
    /// Shards copied.
    pub shards: usize,
    /// The count trees' branching factor, which the copy keeps.
    pub branching: u32,
    /// Stored entries copied.
    pub entries: u64,
    /// Bytes of keys and values copied.
    pub bytes: u64,
    /// Wall time.
    pub seconds: f64,
}

/// Why a backup failed; the target dir then holds no layout file.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The server or the connection.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The target dir cannot take a backup.
    #[error("{0}")]
    Target(String),
    /// Writing a shard's copy failed.
    #[error("shard {0}: {1}")]
    Shard(usize, ShardError),
    /// Writing the layout file failed.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The stream broke the format's promises.
    #[error("the server's backup stream is malformed: {0}")]
    Stream(String),
}

/// Runs a backup as `args` say.
pub async fn backup(args: &BackupArgs) -> Result<BackupReport, BackupError> {
    let started = Instant::now();
    let dir = &args.to;
    if dir.read_dir().map(|mut entries| entries.next().is_some()).unwrap_or(false) {
        return Err(BackupError::Target(format!("{} exists and is not empty", dir.display())));
    }
    let mut client = args.client.connect().await?;
    let mut stream = client.backup().await?;
    let header = match stream.next().await? {
        Some(BackupPart::Header(header)) => header,
        _ => return Err(BackupError::Stream("it does not start with a header".into())),
    };
    if header.format != FORMAT || header.shards == 0 {
        return Err(BackupError::Target(format!(
            "cannot write a data dir of format {}, {} shards",
            header.format, header.shards
        )));
    }
    std::fs::create_dir_all(dir).map_err(|e| BackupError::Target(format!("{}: {e}", dir.display())))?;
    let (chunks, received) = sync_channel(CHUNKS_AHEAD);
    let target = dir.clone();
    let writer = std::thread::Builder::new()
        .name("backup-writer".into())
        .spawn(move || write_shards(&target, header, &received))
        .map_err(|e| BackupError::Target(format!("starting the writer thread: {e}")))?;
    let bar = spinner(args.quiet);
    let mut streamed = Ok(());
    loop {
        match stream.next().await {
            Ok(Some(BackupPart::Chunk(chunk))) => {
                bar.inc(chunk.entries.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum());
                if chunks.send(chunk).is_err() {
                    break; // the writer failed; it says why
                }
            }
            Ok(Some(BackupPart::Header(_))) => {
                streamed = Err(BackupError::Stream("a second header".into()));
                break;
            }
            Ok(None) => break,
            Err(e) => {
                streamed = Err(e.into());
                break;
            }
        }
    }
    let summary = stream.summary();
    drop(chunks);
    let written = writer.join().unwrap_or_else(|_| Err(BackupError::Stream("the writer thread panicked".into())));
    bar.finish_and_clear();
    written?;
    streamed?;
    let summary = summary.ok_or_else(|| BackupError::Stream("it ended without a summary".into()))?;
    layout::write(dir, Layout { format: header.format, shards: header.shards, branching: header.branching })?;
    Ok(BackupReport {
        shards: summary.shards,
        branching: header.branching,
        entries: summary.entries,
        bytes: summary.bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Writes the chunks into one new shard database per shard, keyspace by
/// keyspace, in the order they come (shards ascending).
fn write_shards(dir: &Path, header: BackupHeader, chunks: &Receiver<BackupChunk>) -> Result<(), BackupError> {
    let mut next = chunks.recv().ok();
    for shard in 0..header.shards {
        let path = layout::shard_dir(dir, shard);
        let writer = ImageWriter::create(&path).map_err(|e| BackupError::Shard(shard, e))?;
        let mut done: Vec<String> = Vec::new();
        while let Some(first) = next.take_if(|chunk| chunk.shard == shard) {
            let keyspace = first.keyspace.clone();
            if done.contains(&keyspace) {
                return Err(BackupError::Stream(format!("keyspace {keyspace} of shard {shard} comes twice")));
            }
            let mut entries = first.entries.into_iter();
            let mut carry = None;
            let pairs = std::iter::from_fn(|| loop {
                if let Some((key, value)) = entries.next() {
                    return Some(Ok((key.into_vec(), value.into_vec())));
                }
                match chunks.recv() {
                    Ok(chunk) if chunk.shard == shard && chunk.keyspace == keyspace => {
                        entries = chunk.entries.into_iter()
                    }
                    Ok(chunk) => {
                        carry = Some(chunk);
                        return None;
                    }
                    Err(_) => return None,
                }
            });
            writer.write_keyspace(&keyspace, pairs).map_err(|e| BackupError::Shard(shard, e))?;
            if let Some(chunk) = carry.as_ref().filter(|chunk| chunk.shard < shard) {
                return Err(BackupError::Stream(format!("shard {} comes after shard {shard}", chunk.shard)));
            }
            done.push(keyspace);
            next = carry;
        }
        writer.finish().map_err(|e| BackupError::Shard(shard, e))?;
    }
    match next {
        Some(chunk) => Err(BackupError::Stream(format!("a chunk of shard {} of {}", chunk.shard, header.shards))),
        None => Ok(()),
    }
}

fn spinner(quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} {elapsed_precise} {bytes} copied ({bytes_per_sec})") {
        bar.set_style(style);
    }
    bar
}

impl BackupReport {
    /// One line for people.
    pub fn describe(&self, dir: &Path) -> String {
        format!(
            "backed up {} shards, {} entries ({}) in {:.1} s to {}; start it with `rankd serve --data-dir {} \
             --shards {} --branching {}`",
            self.shards,
            self.entries,
            HumanBytes(self.bytes),
            self.seconds,
            dir.display(),
            dir.display(),
            self.shards,
            self.branching
        )
    }
}
