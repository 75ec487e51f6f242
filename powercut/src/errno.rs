//! The error every model operation returns: an errno for the kernel.
//!
//! The model is std and libc only (it has no FUSE types), so it speaks raw
//! errno values; the FUSE adapter turns them into `fuser::Errno`.

use std::fmt;

/// A positive errno value (`libc::EIO`, `libc::ENOENT`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// I/O error: the filesystem is dead after a cut, a handle is stale, or
    /// a fault was switched on.
    pub const EIO: Errno = Errno(libc::EIO);
    /// No such file or directory.
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    /// The name already exists.
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    /// Not a directory.
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    /// Is a directory.
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    /// Directory not empty.
    pub const ENOTEMPTY: Errno = Errno(libc::ENOTEMPTY);
    /// Invalid argument.
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    /// No space left on device (the `write-fail enospc` fault).
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    /// Operation not supported (fallocate modes other than the plain ones).
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    /// The name is longer than 255 bytes.
    pub const ENAMETOOLONG: Errno = Errno(libc::ENAMETOOLONG);
    /// File too large (offsets past what the model addresses).
    pub const EFBIG: Errno = Errno(libc::EFBIG);
    /// Operation not permitted (special files, which the model has none of).
    pub const EPERM: Errno = Errno(libc::EPERM);
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

impl std::error::Error for Errno {}

/// The result of a model operation.
pub type Result<T> = std::result::Result<T, Errno>;
