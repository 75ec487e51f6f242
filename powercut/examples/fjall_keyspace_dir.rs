//! A minimal reproducer for fjall 3.1: a keyspace's directory is never made
//! durable in `keyspaces/`, so after a power cut a new database loses the
//! keyspace and every write to it, even writes persisted with
//! `PersistMode::SyncAll` (found by rankd's power-cut tests; rankd works
//! around it by syncing `keyspaces/` after opening its keyspaces).
//!
//! fjall's `Keyspace::create_new` calls `create_dir_all(keyspaces/<id>)`,
//! and lsm-tree syncs the tree's own folder and its `tables/`, but nothing
//! syncs `keyspaces/` after the new entry (`Database::create_new` syncs it
//! before even the meta keyspace's folder is made). On ext4 and XFS a
//! directory entry is durable only once its directory is fsynced.
//!
//! Run as root with fuse3 installed, after `cargo build -p rankd-powercut`:
//! `cargo run -p rankd-powercut --example fjall_keyspace_dir`. It prints
//! what a database holds after a power cut, with and without the
//! workaround.

use std::path::Path;

use fjall::{Database, KeyspaceCreateOptions, PersistMode};
use powercut::Layer;

/// Writes one key, persisted with SyncAll; cuts the power; reopens.
fn survives(layer: &Layer, db_path: &Path, sync_keyspaces_dir: bool) -> fjall::Result<Option<Vec<u8>>> {
    {
        let db = Database::builder(db_path).open()?;
        let items = db.keyspace("items", KeyspaceCreateOptions::default)?;
        if sync_keyspaces_dir {
            std::fs::File::open(db_path.join("keyspaces"))?.sync_all()?;
        }
        items.insert("key", "value")?;
        db.persist(PersistMode::SyncAll)?;
        layer.cut().map_err(fjall::Error::from)?;
    }
    layer.resume().map_err(fjall::Error::from)?;
    let db = Database::builder(db_path).open()?;
    let items = db.keyspace("items", KeyspaceCreateOptions::default)?;
    Ok(items.get("key")?.map(|value| value.to_vec()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = tempfile::tempdir()?;
    let mountpoint = root.path().join("disk");
    std::fs::create_dir(&mountpoint)?;
    let layer = Layer::mount(powercut::find_binary()?, &mountpoint)?;
    // The database's own directory, created and made durable first, so only
    // fjall's own syncs are on trial.
    for (name, workaround) in [("plain", false), ("workaround", true)] {
        let db_path = mountpoint.join(name);
        std::fs::create_dir(&db_path)?;
        std::fs::File::open(&mountpoint)?.sync_all()?;
        let found = survives(&layer, &db_path, workaround)?;
        println!(
            "{name:>10}: after a power cut the SyncAll-persisted key is {}",
            if found.is_some() { "there" } else { "LOST" }
        );
    }
    layer.quit()?;
    Ok(())
}
