//! rankd-powercut: a FUSE filesystem that simulates power cuts (issue 37).
//!
//! `kill -9` keeps the page cache, so a crash test built on it cannot catch
//! a missing fsync. This filesystem keeps every change made since the last
//! fsync in a volatile state, and drops it on command, the way a power cut
//! would. A test mounts it with [`Layer::mount`], runs the program under
//! test on the mountpoint, calls [`Layer::cut`], kills the program, calls
//! [`Layer::resume`], restarts the program and checks what it recovered.
//!
//! # The model
//!
//! The filesystem lives in memory: regular files and directories (no
//! symlinks, hard links, devices or xattrs). `--seed DIR` copies a tree in
//! at mount time as fully durable state.
//!
//! * **Files.** Each regular file has a *current* content and size (what
//!   programs read) and a *durable* one (as of its last `fsync` or
//!   `fdatasync`; both persist data and size alike). `write`, truncation
//!   (`ftruncate`, `O_TRUNC`, `truncate`) and `fallocate` change only the
//!   current state. `fsync`/`fdatasync` make the durable state equal to
//!   the current one, for that file only. Content is stored in 4 KiB
//!   copy-on-write pages shared between the two states, and the pages
//!   written since the last fsync are tracked, so an fsync costs what
//!   changed, not the file size.
//! * **Directories.** Each directory has *current* entries (name → inode)
//!   and *durable* ones. `create`, `mknod`, `mkdir`, `unlink`, `rmdir` and
//!   `rename` (over an existing name too; across directories it changes
//!   both) change only current entries. `fsync` on a directory (fsyncdir,
//!   e.g. `File::open(dir)?.sync_all()`) makes its durable entries equal to
//!   its current ones. So a new file survives a cut only if its directory
//!   was fsynced after it was created, and its data only if the file was
//!   fsynced; an unlinked file comes back unless its directory was fsynced.
//! * **Metadata** (mode, owner, times) is not volatile: a cut keeps it.
//! * **Power cut** (`cut`): atomically, under the lock every operation
//!   takes, every file reverts to its durable content and size, every
//!   directory to its durable entries, inodes the root's durable tree does
//!   not reach are freed, every open handle goes stale (EIO on any use, for
//!   good), and the filesystem goes *dead*: every operation fails with EIO
//!   until `resume`. Modes: `cut` drops everything unsynced; `cut prefix`
//!   keeps, per file, a random prefix of its writes and truncates since its
//!   last fsync, in their order; `cut torn` keeps a random non-empty prefix
//!   whose last write is torn at a random 512-byte-aligned file offset (a
//!   write inside one sector is kept whole or not at all). Directories
//!   always revert fully. Files are visited in inode order with a generator
//!   seeded per cut (from `--seed-rng`, or given to the command), so a cut
//!   replays exactly from its reported seed. If only one side of a
//!   cross-directory rename of a directory was fsynced, the directory can
//!   be reached twice after the revert: its later entry (breadth-first, in
//!   name order) is dropped so the tree stays a tree.
//! * **Slow and failing disks.** `fsync-delay MS` makes every fsync and
//!   fsyncdir sleep that long first (outside the lock: other operations go
//!   on). `fsync-fail on` makes them fail with EIO and persist nothing: the
//!   dirty data stays dirty, and a later successful fsync persists it (Linux
//!   may drop it instead; programs must not count on either). `write-fail
//!   on` makes `write` and `fallocate` fail with EIO, `write-fail enospc`
//!   with ENOSPC; either way nothing changes.
//! * **No kernel caching.** Files are opened with `FOPEN_DIRECT_IO` and
//!   attribute and entry TTLs are zero, so after a cut the kernel sees the
//!   reverted state at once. Consequence: shared writable `mmap` of files is
//!   not supported (ENODEV); `flock` and POSIX locks are the kernel's local
//!   ones. Files are limited to 16 GiB.
//! * `sync(2)`/`syncfs(2)` persist nothing here: only fsync and fsyncdir
//!   do. The control command `sync` ([`Layer::sync_all`]) makes everything
//!   durable at once, as a baseline after a test's setup.
//!
//! # Control
//!
//! The daemon, `rankd-powercut MOUNTPOINT [--seed DIR] [--seed-rng N]
//! [--threads N]`, prints `ready` once it serves, then reads one command a
//! line on stdin and answers each with one line: `ok`, `ok {json}` or
//! `error MESSAGE`. See [`Command`] for the commands; EOF on stdin, `quit`
//! and SIGTERM/SIGINT/SIGHUP unmount and exit. The mount uses fusermount3's
//! `auto_unmount`, so even a `kill -9` of the daemon leaves no mount behind;
//! a stale mount (from a run without it) goes with `fusermount3 -u -z DIR`
//! or [`force_unmount`].

mod client;
mod content;
mod control;
mod cut;
mod data;
mod dir;
mod errno;
mod file;
mod fs;
mod inode;
mod json;
mod mounts;
mod namespace;
mod rng;
mod seed;
mod stats;

#[cfg(feature = "daemon")]
pub mod daemon;

pub use client::{find_binary, Layer, Options, BINARY_NAME};
pub use content::PAGE_SIZE;
pub use control::{Command, Reply, WriteFail};
pub use data::{SetAttr, MAX_FILE_SIZE};
pub use dir::Ino;
pub use errno::Errno;
pub use fs::{DirItem, Faults, Fs, FsSize};
pub use inode::{Attr, Kind, Meta, ROOT};
pub use mounts::{force_unmount, is_mounted};
pub use namespace::RenameMode;
pub use seed::{seed, SeedReport};
pub use stats::{CutMode, CutReport, Stats};
