//! SIGTERM, SIGINT and SIGHUP become a clean unmount.
//!
//! The signals are blocked in every thread (the mask is set before any
//! thread starts, and threads inherit it) and one thread takes them with
//! `sigwait`, so the shutdown runs as ordinary code on the control loop
//! rather than in a signal handler. Child processes do not inherit the
//! mask: std resets it before exec.

use std::io;
use std::sync::mpsc::Sender;
use std::thread;

/// The signals that stop the daemon.
const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

fn stop_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it fully and
    // sigaddset only sets bits of valid signal numbers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in STOP_SIGNALS {
            libc::sigaddset(&mut set, signal);
        }
        set
    }
}

/// Blocks the stop signals in this thread (and so in every thread spawned
/// from now on) and sends `event(signal)` on `sender` when one arrives.
/// Call it before spawning any thread.
pub fn forward_stop_signals<E: Send + 'static>(sender: Sender<E>, event: fn(i32) -> E) -> io::Result<()> {
    let set = stop_set();
    // SAFETY: `set` is an initialised sigset_t and a null old-set pointer is
    // allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    thread::Builder::new().name("powercut-signals".into()).spawn(move || loop {
        let mut signal: libc::c_int = 0;
        // SAFETY: both pointers point to live, initialised locals.
        let rc = unsafe { libc::sigwait(&set, &mut signal) };
        if rc == 0 {
            let _ = sender.send(event(signal));
            return;
        }
    })?;
    Ok(())
}
