//! The data dir's layout file: how many shards and which branching factor it
//! was made with. Opening it with another shard count would hash players to
//! the wrong shards, so it is refused with a clear message instead.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// File name inside the data dir.
pub const LAYOUT_FILE: &str = "rankd.layout.toml";
/// The on-disk format this rankd writes and reads.
pub const FORMAT: u32 = 1;

/// What a data dir was created with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// On-disk format version.
    pub format: u32,
    /// Number of shards (and `shard-<i>` directories).
    pub shards: usize,
    /// Count-tree branching factor.
    pub branching: u32,
}

/// Why a data dir cannot be opened as asked.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// Shard count differs from the data dir's.
    #[error("data dir {dir} holds {stored} shards but --shards {wanted} was asked; restart with --shards {stored} (rankd does not rebalance a data dir)")]
    Shards {
        /// The data dir.
        dir: PathBuf,
        /// What it holds.
        stored: usize,
        /// What was asked.
        wanted: usize,
    },
    /// Branching differs from the data dir's.
    #[error("data dir {dir} uses branching factor {stored} but {wanted} was asked; restart with --branching {stored}")]
    Branching {
        /// The data dir.
        dir: PathBuf,
        /// What it holds.
        stored: u32,
        /// What was asked.
        wanted: u32,
    },
    /// A shard's directory is gone from a data dir that had it.
    #[error("data dir {dir} holds {shards} shards but shard-{missing} is missing: restore it (from a backup, or put it back) before starting; starting without it would lose its players")]
    MissingShard {
        /// The data dir.
        dir: PathBuf,
        /// Its shard count.
        shards: usize,
        /// The shard whose directory is missing.
        missing: usize,
    },
    /// Unreadable or from a newer rankd.
    #[error("cannot use layout file {path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// I/O.
    #[error("data dir {0}: {1}")]
    Io(PathBuf, std::io::Error),
}

/// Directory of shard `index`.
pub fn shard_dir(data_dir: &Path, index: usize) -> PathBuf {
    data_dir.join(format!("shard-{index}"))
}

/// Creates a new data dir (its shard directories, then the layout file),
/// or checks an existing one matches `shards` and `branching` and still
/// has every shard's directory. The layout file is written last, so a data
/// dir that has one had every shard directory: one missing now was lost
/// or moved, and is not silently made again, empty.
pub fn check_or_create(data_dir: &Path, shards: usize, branching: u32) -> Result<Layout, LayoutError> {
    let path = data_dir.join(LAYOUT_FILE);
    let wanted = Layout { format: FORMAT, shards, branching };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let stored: Layout = toml::from_str(&text)
                .map_err(|e| LayoutError::Invalid { path: path.clone(), reason: e.to_string() })?;
            if stored.format != FORMAT {
                return Err(LayoutError::Invalid { path, reason: format!("format {} is not {FORMAT}", stored.format) });
            }
            if stored.shards != shards {
                return Err(LayoutError::Shards { dir: data_dir.to_path_buf(), stored: stored.shards, wanted: shards });
            }
            if stored.branching != branching {
                return Err(LayoutError::Branching {
                    dir: data_dir.to_path_buf(),
                    stored: stored.branching,
                    wanted: branching,
                });
            }
            if let Some(missing) = (0..shards).find(|&index| !shard_dir(data_dir, index).is_dir()) {
                return Err(LayoutError::MissingShard { dir: data_dir.to_path_buf(), shards, missing });
            }
            Ok(stored)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Empty shard directories are a start cut short before its
            // layout file was written: nothing was stored in them.
            let used = |dir: PathBuf| std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some());
            if (0..shards).map(|index| shard_dir(data_dir, index)).any(used) {
                return Err(LayoutError::Invalid {
                    path,
                    reason: "shard directories exist but the layout file is missing".into(),
                });
            }
            create_shard_dirs(data_dir, shards)?;
            write(data_dir, wanted)?;
            Ok(wanted)
        }
        Err(e) => Err(LayoutError::Io(data_dir.to_path_buf(), e)),
    }
}

/// Creates the shard directories a data dir lacks, and makes their names
/// durable. fjall syncs what it creates inside a database's directory but
/// not the directory's own entry in its parent: after a power cut a new
/// shard's directory, with the journal of its acknowledged writes, was gone
/// (found by the power-cut tests).
fn create_shard_dirs(data_dir: &Path, shards: usize) -> Result<(), LayoutError> {
    let io = |e| LayoutError::Io(data_dir.to_path_buf(), e);
    let mut created = false;
    for index in 0..shards {
        let dir = shard_dir(data_dir, index);
        if !dir.is_dir() {
            std::fs::create_dir_all(&dir).map_err(io)?;
            created = true;
        }
    }
    if created {
        sync_dir(data_dir).map_err(io)?;
    }
    Ok(())
}

/// Writes the layout file of `data_dir` (created if need be), durably: a
/// new data dir's, or a restored backup's once its shards are in place.
pub fn write(data_dir: &Path, layout: Layout) -> Result<(), LayoutError> {
    let path = data_dir.join(LAYOUT_FILE);
    std::fs::create_dir_all(data_dir).map_err(|e| LayoutError::Io(data_dir.to_path_buf(), e))?;
    let text =
        toml::to_string(&layout).map_err(|e| LayoutError::Invalid { path: path.clone(), reason: e.to_string() })?;
    write_durably(data_dir, &path, text.as_bytes()).map_err(|e| LayoutError::Io(data_dir.to_path_buf(), e))
}

/// Writes `bytes` to `path` in `dir` so that after a crash or a power cut
/// the file holds all of them or does not exist: written to a temporary
/// file and synced, renamed over `path`, then the directory synced (and its
/// parent, which may have just created it) so the new name is on disk too.
/// Without the syncs a power cut can leave the renamed file empty.
fn write_durably(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = dir.join(format!("{LAYOUT_FILE}.tmp"));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    sync_dir(dir)?;
    match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent),
        _ => Ok(()),
    }
}

/// Makes a directory's entries durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_another_shard_count() {
        let dir = tempfile::tempdir().unwrap();
        check_or_create(dir.path(), 4, 16).unwrap();
        check_or_create(dir.path(), 4, 16).unwrap();
        let err = check_or_create(dir.path(), 2, 16).unwrap_err().to_string();
        assert!(err.contains("holds 4 shards") && err.contains("--shards 4"), "{err}");
        assert!(check_or_create(dir.path(), 4, 64).is_err());
    }

    #[test]
    fn a_shard_directory_gone_from_a_data_dir_is_refused_not_made_again_empty() {
        let dir = tempfile::tempdir().unwrap();
        check_or_create(dir.path(), 3, 16).unwrap();
        assert!((0..3).all(|index| shard_dir(dir.path(), index).is_dir()), "made with the data dir");
        std::fs::remove_dir_all(shard_dir(dir.path(), 1)).unwrap();
        let err = check_or_create(dir.path(), 3, 16).unwrap_err().to_string();
        assert!(err.contains("shard-1 is missing"), "{err}");
        assert!(!shard_dir(dir.path(), 1).exists(), "not made again");
    }

    #[test]
    fn empty_shard_directories_without_a_layout_are_a_start_cut_short() {
        let dir = tempfile::tempdir().unwrap();
        create_shard_dirs(dir.path(), 2).unwrap(); // then the process died
        check_or_create(dir.path(), 2, 16).unwrap();
        let used = tempfile::tempdir().unwrap();
        create_shard_dirs(used.path(), 2).unwrap();
        std::fs::write(shard_dir(used.path(), 0).join("journal"), b"acknowledged writes").unwrap();
        let err = check_or_create(used.path(), 2, 16).unwrap_err().to_string();
        assert!(err.contains("layout file is missing"), "{err}");
    }

    #[test]
    fn a_new_data_dir_gets_its_layout_whole_and_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("nested").join("data");
        std::fs::create_dir_all(data.parent().unwrap()).unwrap();
        let layout = check_or_create(&data, 3, 32).unwrap();
        let text = std::fs::read_to_string(data.join(LAYOUT_FILE)).unwrap();
        assert_eq!(toml::from_str::<Layout>(&text).unwrap(), layout);
        assert!(!data.join(format!("{LAYOUT_FILE}.tmp")).exists());
    }
}
