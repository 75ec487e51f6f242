//! The engine's errors. The server maps them to protocol codes in one place.

/// Everything that can go wrong inside a shard.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardError {
    /// An `incr` would leave the i64 range; nothing was changed.
    #[error("score overflow: the result is outside the 64-bit range")]
    Overflow,
    /// A composite score's write would leave a field's range, or a score
    /// is not the board's kind; nothing was changed.
    #[error(transparent)]
    Fields(#[from] crate::fields::FieldsError),
    /// A read that scans storage ran while writes were staged: the caller must
    /// commit first (a bug in the caller, never a client's fault).
    #[error("operation needs the open batch committed first")]
    NeedsCommit,
    /// The data dir was made with another branching factor.
    #[error("data dir uses branching factor {stored}, not {wanted}; start with --branching {stored}")]
    BranchingMismatch {
        /// What the data dir holds.
        stored: u32,
        /// What was asked for.
        wanted: u32,
    },
    /// The storage engine failed (disk full, I/O error): the batch did not apply.
    #[error("storage: {0}")]
    Storage(#[from] fjall::Error),
    /// The storage's last opening still holds its journal: opening it
    /// again now could lose writes (see `Shard::reopen`); retry later.
    #[error("storage still closing: its last opening holds the journal")]
    StillClosing,
    /// Stored bytes do not decode: the data dir is damaged.
    #[error("corrupt data: {0}")]
    Corrupt(&'static str),
    /// A stored tree leaf is damaged.
    #[error(transparent)]
    CorruptLeaf(#[from] crate::tree::CorruptLeaf),
    /// Counts and index disagree (found by [`crate::Shard::check`]).
    #[error("inconsistent shard: {0}")]
    Inconsistent(String),
    /// A shard image cannot be written where or as asked.
    #[error("shard image: {0}")]
    ImageTarget(String),
    /// Invalid branching factor.
    #[error(transparent)]
    Branching(#[from] crate::tree::BadBranching),
}
