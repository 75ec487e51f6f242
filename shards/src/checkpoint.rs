//! A checkpoint's leaves, written to table files while the shard is still
//! copying them.
//!
//! A checkpoint copies nearly every leaf of a shard's trees (random writes
//! touch them all between checkpoints), a slice with each sealed batch. Held
//! until the copy was done and then written by the runs thread, the copies
//! raised the server's memory peak at every checkpoint (see
//! docs/performance-history.md). So each slice goes to a [`LeafWriter`] as
//! soon as it is copied: its own thread picks the changed leaves out,
//! encodes them and appends them to an ingestion (fjall's sorted-tables
//! writer), which holds little more than the block it is filling. The
//! tables join the keyspace only when the ingestion finishes, all at once,
//! which the runs thread asks for once the log the leaves cover is durable
//! and the runs before them are written; until then they are files no
//! reader sees, and a crash leaves them for fjall to delete at the next
//! start.
//!
//! Why tables and not a write batch: written as a batch, a checkpoint went
//! through fjall's journal and memtables while holding the journal's writer
//! lock: every acknowledgment waited behind it (see
//! docs/performance-history.md), the next fsync carried its megabytes, and
//! the memtables were flushed to tables once more later. The marker of the
//! log the leaves hold goes into the same tables, so a crash between their
//! finishing and the log deletion that follows cannot replay a record into
//! leaves that hold it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use fjall::Keyspace;

use crate::error::ShardError;
use crate::key::{TreeId, TREE_PREFIX_LEN};
use crate::tree::{LeafEncoding, LeafId, LeafSlice, SlicePicker};

/// What a [`LeafWriter`]'s thread ends with.
struct Outcome {
    /// Why writing failed, if it did.
    failure: Option<ShardError>,
    /// Each tree's changed leaves, for an abandoned checkpoint to give back.
    changed: HandedOut,
}

/// The changed leaves the slices handed out, by tree: what an abandoned
/// checkpoint gives back. Held until the checkpoint ends, for every tree
/// that changed: a compact tree's root alone, what nearly all of a million
/// small boards hand out, is kept as its id, not as a list of one.
#[derive(Default)]
struct HandedOut {
    /// Trees that handed out their root leaf alone.
    roots: Vec<TreeId>,
    /// Every other tree, with its leaves.
    leaves: Vec<(TreeId, Vec<LeafId>)>,
}

impl HandedOut {
    fn keep(&mut self, tree: TreeId, picker: SlicePicker) {
        let changed = picker.into_changed();
        if changed == [LeafId::ROOT] {
            self.roots.push(tree);
        } else {
            self.leaves.push((tree, changed));
        }
    }

    fn into_vec(self) -> Vec<(TreeId, Vec<LeafId>)> {
        let roots = self.roots.into_iter().map(|tree| (tree, vec![LeafId::ROOT]));
        self.leaves.into_iter().chain(roots).collect()
    }
}

/// Writes one checkpoint's leaves on a thread of its own as the slices come
/// (see the module docs). Dropped without [`LeafWriter::finish`], it
/// abandons them.
pub(crate) struct LeafWriter {
    /// The thread's queue; dropped (`None`) to tell it no more slices come.
    slices: Option<mpsc::Sender<(TreeId, LeafSlice)>>,
    /// Slices sent and not yet written.
    queued: Arc<AtomicUsize>,
    /// Set when the checkpoint is dropped: the thread writes nothing more
    /// and never finishes the ingestion.
    abandoned: Arc<AtomicBool>,
    /// The writing thread, joined (`None` after) to learn how it ended.
    thread: Option<JoinHandle<Outcome>>,
}

impl LeafWriter {
    /// Starts the writer of a checkpoint into `keyspace` that holds every
    /// log record before `through`: `marker` (the key saying so) goes
    /// first, as it sorts before every leaf key. `on_start` runs first on
    /// the new thread (the server lowers its priority there).
    pub(crate) fn start(
        keyspace: Keyspace,
        marker: &'static [u8],
        through: u64,
        encoding: LeafEncoding,
        on_start: Option<fn()>,
    ) -> std::io::Result<Self> {
        let (slices, queue) = mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let abandoned = Arc::new(AtomicBool::new(false));
        let thread = {
            let (queued, abandoned) = (queued.clone(), abandoned.clone());
            std::thread::Builder::new().name("rankd-leaves".into()).spawn(move || {
                if let Some(on_start) = on_start {
                    on_start();
                }
                let marker = (marker, through.to_be_bytes());
                write_leaves(&keyspace, marker, encoding, queue, &queued, &abandoned)
            })?
        };
        Ok(Self { slices: Some(slices), queued, abandoned, thread: Some(thread) })
    }

    /// Hands the next slice of tree `tree` to the writer. Trees must come in
    /// key order, each tree's slices in the order taken.
    pub(crate) fn send(&self, tree: TreeId, slice: LeafSlice) {
        if let Some(slices) = &self.slices {
            self.queued.fetch_add(1, Ordering::Relaxed);
            // A writer that is gone failed or panicked: `finish` says so.
            let _ = slices.send((tree, slice));
        }
    }

    /// Slices sent and not yet written.
    pub(crate) fn backlog(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Waits for every slice sent to be written, then makes the tables part
    /// of the keyspace, all at once and durably. Call once the last slice
    /// of every tree is sent.
    pub(crate) fn finish(mut self) -> Result<(), ShardError> {
        match self.end().failure {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }

    /// Drops what was written (nothing of it is ever read) and gives back
    /// the changed leaves the slices handed out, by tree.
    pub(crate) fn abandon(mut self) -> Vec<(TreeId, Vec<LeafId>)> {
        self.abandoned.store(true, Ordering::Relaxed);
        self.end().changed.into_vec()
    }

    /// Closes the queue and waits for the thread.
    fn end(&mut self) -> Outcome {
        self.slices = None;
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(outcome)) => outcome,
            Some(Err(_)) => Outcome {
                failure: Some(ShardError::Corrupt("the leaf writer panicked")),
                changed: HandedOut::default(),
            },
            None => Outcome { failure: None, changed: HandedOut::default() },
        }
    }
}

impl Drop for LeafWriter {
    fn drop(&mut self) {
        // The thread holds a handle on the keyspace: gone before a reopen.
        if self.thread.is_some() {
            self.abandoned.store(true, Ordering::Relaxed);
            self.end();
        }
    }
}

/// The writer thread: appends every slice from `queue` to an ingestion
/// into `keyspace`, after the `marker` key and value, until the queue
/// closes, then finishes the ingestion unless abandoned. After a failure
/// nothing more is written, but each tree's changed leaves are still kept.
fn write_leaves(
    keyspace: &Keyspace,
    marker: (&[u8], [u8; 8]),
    encoding: LeafEncoding,
    queue: mpsc::Receiver<(TreeId, LeafSlice)>,
    queued: &AtomicUsize,
    abandoned: &AtomicBool,
) -> Outcome {
    let mut failure: Option<ShardError> = None;
    let started = keyspace.start_ingestion().and_then(|mut tables| tables.write(marker.0, marker.1).map(|()| tables));
    let mut tables = started.map_err(|e| failure = Some(e.into())).ok();
    // The tree whose slices are coming, with its picker; the trees before.
    let mut current: Option<(TreeId, SlicePicker)> = None;
    let mut handed_out = HandedOut::default();
    for (tree, mut slice) in queue {
        queued.fetch_sub(1, Ordering::Relaxed);
        if current.as_ref().is_none_or(|(last, _)| *last != tree) {
            if let Some((done, picker)) = current.replace((tree, SlicePicker::default())) {
                handed_out.keep(done, picker);
            }
        }
        let Some((_, picker)) = current.as_mut() else { continue };
        let Some(ingestion) = tables.as_mut().filter(|_| !abandoned.load(Ordering::Relaxed)) else {
            picker.pass(&mut slice); // keeps what an abandoned checkpoint gives back
            continue;
        };
        // A panic here (fjall asserts the keys' order) must not lose the
        // changed leaves an abandoned checkpoint gives back: the picker
        // keeps them before it writes anything.
        let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            picker.pick(slice, encoding, |leaf, bytes| {
                let key = leaf_key(tree, leaf);
                match bytes {
                    Some(bytes) => ingestion.write(key, bytes),
                    None => ingestion.write_tombstone(key),
                }
            })
        }));
        let failed = match written {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e.into(),
            Err(_) => ShardError::Corrupt("writing a checkpoint's leaves panicked"),
        };
        failure.get_or_insert(failed);
        tables = None;
    }
    if let Some(tables) = tables.filter(|_| !abandoned.load(Ordering::Relaxed)) {
        if let Err(e) = tables.finish() {
            failure.get_or_insert(e.into());
        }
    }
    if let Some((tree, picker)) = current {
        handed_out.keep(tree, picker);
    }
    Outcome { failure, changed: handed_out }
}

/// A leaf's key: its tree's prefix, then its sub-range's start and depth.
pub(crate) fn leaf_key(tree: TreeId, leaf: LeafId) -> Vec<u8> {
    let mut key = Vec::with_capacity(TREE_PREFIX_LEN + 17);
    key.extend_from_slice(&tree.prefix());
    key.extend_from_slice(&leaf.prefix.to_be_bytes());
    key.push(leaf.depth);
    key
}
