//! Is a path a mountpoint, and how to get rid of a mount that a killed
//! daemon left behind ("Transport endpoint is not connected").

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// Undoes the octal escapes (`\040` for a space) of /proc/self/mountinfo.
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal =
            bytes.get(i + 1..i + 4).filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

/// Whether `path` (canonical: mountinfo lists canonical paths) is a mount
/// point in this process's mount namespace.
pub fn is_mounted(path: &Path) -> io::Result<bool> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    let want = path.as_os_str().as_bytes();
    Ok(text.lines().filter_map(|line| line.split(' ').nth(4)).any(|field| unescape(field) == want))
}

/// `umount2(path, MNT_DETACH)`: allowed to root only.
fn detach(path: &Path) -> io::Result<()> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: a valid NUL-terminated path; umount2 reads it only.
    if unsafe { libc::umount2(c_path.as_ptr(), libc::MNT_DETACH) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Detaches the mount at `path` lazily (open files do not keep it busy):
/// directly when root, else with `fusermount3 -u -z`, `fusermount -u -z` or
/// `umount -l`. Ok if it is gone after.
pub fn force_unmount(path: &Path) -> io::Result<()> {
    if detach(path).is_ok() && !is_mounted(path)? {
        return Ok(());
    }
    let attempts: [(&str, &[&str]); 3] =
        [("fusermount3", &["-u", "-z", "-q"]), ("fusermount", &["-u", "-z", "-q"]), ("umount", &["-l"])];
    for (program, args) in attempts {
        let _ = Command::new(program)
            .args(args.iter().map(OsStr::new))
            .arg(path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !is_mounted(path)? {
            return Ok(());
        }
    }
    Err(io::Error::other(format!("{} is still mounted after fusermount3 -u -z and umount -l", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_mountinfo_fields() {
        assert_eq!(unescape(r"/tmp/a\040b"), b"/tmp/a b");
        assert_eq!(unescape(r"/x\y\12"), br"/x\y\12");
        assert_eq!(unescape("/plain"), b"/plain");
        assert!(is_mounted(Path::new("/")).unwrap());
        assert!(!is_mounted(Path::new("/surely/not/a/mountpoint")).unwrap());
    }
}
