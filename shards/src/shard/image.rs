//! Point-in-time images of a shard's storage, for online backups.
//!
//! Everything a shard keeps is in its fjall keyspaces, and a fjall snapshot
//! of a settled shard is exactly what a restart after a crash at that
//! moment would find: the change log of every committed batch, runs and
//! checkpoint leaves as far as they reach. So an image is the settled
//! shard's keyspaces read through one snapshot, and restoring it is writing
//! the same keys into a new database: opening that replays the log like
//! any restart, and `rankd check` holds it to the same invariants.

use std::path::Path;
use std::sync::Arc;

use fjall::{Keyspace, Readable as _, Snapshot};

use super::storage::Storage;
use super::{Shard, ShardOptions};
use crate::error::ShardError;

/// The keyspaces an image holds, in the order they are read and written.
pub const IMAGE_KEYSPACES: [&str; 5] = ["meta", "changes", "tree", "players", "index"];

/// One shard's storage frozen at a point in time, readable from any thread
/// while the shard goes on. Old versions its keys had are kept from
/// compaction until it is dropped, so hold it only as long as a copy takes.
pub struct ShardImage {
    snapshot: Snapshot,
    keyspaces: Vec<(&'static str, Keyspace)>,
    branching: u32,
    /// Counts the shard's live images ([`Shard::images_alive`]).
    _alive: Arc<()>,
}

impl Shard {
    /// Takes an image of everything committed. The shard must be settled
    /// (nothing staged or in flight): then the image holds every batch
    /// acknowledged so far and nothing half-written.
    pub fn image(&self) -> Result<ShardImage, ShardError> {
        if !self.is_settled() {
            return Err(ShardError::NeedsCommit);
        }
        let storage = &self.storage;
        let keyspaces = (IMAGE_KEYSPACES.iter())
            .filter_map(|name| storage.keyspace(name).map(|keyspace| (*name, keyspace.clone())))
            .collect();
        let alive = self.images.clone();
        Ok(ShardImage { snapshot: storage.db.snapshot(), keyspaces, branching: self.options.branching, _alive: alive })
    }
}

impl Shard {
    /// Whether an image of this shard is still held (a backup streaming).
    /// Its keyspace handles hold the database's lock, so reopening the
    /// storage must wait for it.
    pub fn images_alive(&self) -> bool {
        Arc::strong_count(&self.images) > 1
    }
}

impl std::fmt::Debug for ShardImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardImage").field("seqno", &self.snapshot.seqno()).finish_non_exhaustive()
    }
}

impl ShardImage {
    /// The count-tree branching factor of the shard's data dir.
    pub fn branching(&self) -> u32 {
        self.branching
    }

    /// Every key and value of every keyspace, keyspace by keyspace (in
    /// [`IMAGE_KEYSPACES`] order), each in ascending key order.
    pub fn entries(&self) -> impl Iterator<Item = Result<(&'static str, Vec<u8>, Vec<u8>), ShardError>> + '_ {
        self.keyspaces.iter().flat_map(move |(name, keyspace)| {
            self.snapshot.iter(keyspace).map(move |guard| {
                let (key, value) = guard.into_inner()?;
                Ok((*name, key.to_vec(), value.to_vec()))
            })
        })
    }
}

/// Writes an image into a new, empty shard directory, one keyspace after
/// another, each with the tuning [`Shard::open`] gives it.
pub struct ImageWriter {
    storage: Storage,
}

impl ImageWriter {
    /// Creates the shard database at `path`, which must not hold one.
    pub fn create(path: &Path) -> Result<Self, ShardError> {
        let occupied = path.read_dir().map(|mut entries| entries.next().is_some()).unwrap_or(false);
        if occupied {
            return Err(ShardError::ImageTarget(format!("{} is not empty", path.display())));
        }
        Ok(Self { storage: Storage::open(path, &ShardOptions::default())? })
    }

    /// Writes one keyspace's entries, which must come in strictly ascending
    /// key order (as [`ShardImage::entries`] gives them): the tables are
    /// written directly, not through the journal. Returns how many.
    pub fn write_keyspace(
        &self,
        name: &str,
        entries: impl IntoIterator<Item = Result<(Vec<u8>, Vec<u8>), ShardError>>,
    ) -> Result<u64, ShardError> {
        let keyspace = self.keyspace(name)?;
        let mut ingestion = keyspace.start_ingestion()?;
        let mut last: Option<Vec<u8>> = None;
        let mut written = 0;
        for entry in entries {
            let (key, value) = entry?;
            // fjall panics on unsorted input; a damaged stream is an error.
            if last.as_ref().is_some_and(|last| *last >= key) {
                return Err(ShardError::ImageTarget(format!("keys of keyspace {name} out of order")));
            }
            ingestion.write(key.as_slice(), value)?;
            last = Some(key);
            written += 1;
        }
        ingestion.finish()?;
        Ok(written)
    }

    /// Makes everything written durable and closes the database.
    pub fn finish(self) -> Result<(), ShardError> {
        self.storage.db.persist(fjall::PersistMode::SyncAll)?;
        Ok(())
    }

    fn keyspace(&self, name: &str) -> Result<&Keyspace, ShardError> {
        (self.storage.keyspace(name)).ok_or_else(|| ShardError::ImageTarget(format!("no keyspace named {name:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::Mode;

    /// An image written into a new directory opens as the same shard.
    #[test]
    fn an_image_restores_the_same_shard() {
        let (board, tree) = super::super::all_time_board();
        let dir = tempfile::tempdir().unwrap();
        let mut shard = Shard::open(dir.path(), ShardOptions::default()).unwrap();
        shard.ensure_board(&board);
        for i in 0..500i64 {
            shard.write(&board, &format!("p{i}"), i * 7 % 101, Mode::Set, i as u64 + 1).unwrap();
        }
        shard.commit().unwrap();
        let image = shard.image().unwrap();
        // Written after the image: not in it.
        shard.write(&board, "late", 5, Mode::Set, 10_000).unwrap();
        shard.commit().unwrap();

        let copy = tempfile::tempdir().unwrap();
        let writer = ImageWriter::create(copy.path()).unwrap();
        for name in IMAGE_KEYSPACES {
            let entries = image.entries().filter_map(Result::ok).filter(|(ks, ..)| *ks == name);
            writer.write_keyspace(name, entries.map(|(_, k, v)| Ok((k, v)))).unwrap();
        }
        writer.finish().unwrap();
        drop(image);

        let restored = Shard::open(copy.path(), ShardOptions::default()).unwrap();
        restored.check().unwrap();
        assert_eq!(restored.players(), 500);
        assert_eq!(restored.count(tree), 500);
        assert!(restored.get(tree, "late").unwrap().is_none());
        assert_eq!(restored.get(tree, "p3").unwrap().map(|r| r.score), Some(21));
    }

    #[test]
    fn refuses_a_used_directory_and_unsorted_keys() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("x"), b"x").unwrap();
        assert!(ImageWriter::create(dir.path()).is_err());
        let empty = tempfile::tempdir().unwrap();
        let writer = ImageWriter::create(empty.path()).unwrap();
        let entries = [Ok((b"b".to_vec(), vec![])), Ok((b"a".to_vec(), vec![]))];
        assert!(writer.write_keyspace("meta", entries).is_err());
        assert!(writer.write_keyspace("nope", []).is_err());
    }
}
