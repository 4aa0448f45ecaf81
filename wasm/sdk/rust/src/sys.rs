//! The raw host imports of ABI major 1 (module `engram_host_v1`, ABI.md
//! section 3), and their native stand-ins.
//!
//! This module owns the FFI boundary with the host and nothing else: thin
//! functions taking slices, so that the unsafe code is here, in one place,
//! and every other module is safe. The safe, idiomatic wrappers are
//! [`crate::log`], [`crate::clock`] and [`crate::net`].
//!
//! Outside wasm (the SDK's own tests, a plugin's native unit tests) the
//! imports are stand-ins: logs at info level and above go to stderr (debug
//! logs would drown test output), clocks are the process's, and every
//! socket call is denied, as a host that granted nothing answers.

#[cfg(target_arch = "wasm32")]
mod imp {
    // `link_name` is the import's name in module engram_host_v1; the Rust
    // items are prefixed so that they read as host calls. rustc keeps these
    // imports apart from libc's symbols of the same name: a plugin using
    // f64::ln (libm's `log`) links and logs fine.
    #[link(wasm_import_module = "engram_host_v1")]
    extern "C" {
        #[link_name = "log"]
        fn engram_log(level: i32, ptr: *const u8, len: usize);
        #[link_name = "clock_now"]
        fn engram_clock_now(clock: i32) -> i64;
        #[link_name = "net_dial"]
        fn engram_net_dial(ptr: *const u8, len: usize, timeout_ms: i32) -> i32;
        #[link_name = "net_read"]
        fn engram_net_read(handle: i32, ptr: *mut u8, len: usize) -> i32;
        #[link_name = "net_write"]
        fn engram_net_write(handle: i32, ptr: *const u8, len: usize) -> i32;
        #[link_name = "net_close"]
        fn engram_net_close(handle: i32) -> i32;
        #[link_name = "net_set_deadline"]
        fn engram_net_set_deadline(handle: i32, which: i32, unix_ns: i64) -> i32;
    }

    pub fn log(level: i32, msg: &[u8]) {
        // SAFETY: the host reads msg.len() bytes at msg.as_ptr(), which the
        // slice keeps alive and readable for the call; it keeps no pointer.
        unsafe { engram_log(level, msg.as_ptr(), msg.len()) }
    }

    pub fn clock_now(clock: i32) -> i64 {
        // SAFETY: no pointers; any clock id is valid input (unknown ones
        // return -1).
        unsafe { engram_clock_now(clock) }
    }

    pub fn net_dial(addr: &[u8], timeout_ms: i32) -> i32 {
        // SAFETY: the host reads addr.len() bytes at addr.as_ptr(), alive
        // for the call; it keeps no pointer.
        unsafe { engram_net_dial(addr.as_ptr(), addr.len(), timeout_ms) }
    }

    pub fn net_read(handle: i32, buf: &mut [u8]) -> i32 {
        // SAFETY: the host writes at most buf.len() bytes at buf.as_mut_ptr(),
        // which the exclusive borrow keeps alive and unaliased for the call.
        unsafe { engram_net_read(handle, buf.as_mut_ptr(), buf.len()) }
    }

    pub fn net_write(handle: i32, buf: &[u8]) -> i32 {
        // SAFETY: the host reads at most buf.len() bytes at buf.as_ptr(),
        // alive for the call.
        unsafe { engram_net_write(handle, buf.as_ptr(), buf.len()) }
    }

    pub fn net_close(handle: i32) -> i32 {
        // SAFETY: no pointers; unknown handles answer CLOSED.
        unsafe { engram_net_close(handle) }
    }

    pub fn net_set_deadline(handle: i32, which: i32, unix_ns: i64) -> i32 {
        // SAFETY: no pointers; bad selectors answer INVALID.
        unsafe { engram_net_set_deadline(handle, which, unix_ns) }
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use crate::abi::{Errno, CLOCK_MONOTONIC, CLOCK_REALTIME};
    use std::io::Write;
    use std::sync::Mutex;
    use std::time::{Instant, SystemTime, UNIX_EPOCH};

    pub fn log(level: i32, msg: &[u8]) {
        if level < crate::abi::LOG_INFO {
            return;
        }
        let mut e = std::io::stderr().lock();
        // A failed write to stderr has nowhere to be reported.
        let _ = writeln!(e, "[plugin {level}] {}", String::from_utf8_lossy(msg));
    }

    pub fn clock_now(clock: i32) -> i64 {
        // The origin of the monotonic clock, shared by every thread.
        static ORIGIN: Mutex<Option<Instant>> = Mutex::new(None);
        match clock {
            CLOCK_REALTIME => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
            CLOCK_MONOTONIC => {
                let mut origin = ORIGIN.lock().unwrap_or_else(|e| e.into_inner());
                let start = *origin.get_or_insert_with(Instant::now);
                i64::try_from(start.elapsed().as_nanos()).unwrap_or(i64::MAX)
            }
            _ => -1,
        }
    }

    pub fn net_dial(_addr: &[u8], _timeout_ms: i32) -> i32 {
        Errno::Denied.code()
    }

    pub fn net_read(_handle: i32, _buf: &mut [u8]) -> i32 {
        Errno::Closed.code()
    }

    pub fn net_write(_handle: i32, _buf: &[u8]) -> i32 {
        Errno::Closed.code()
    }

    pub fn net_close(_handle: i32) -> i32 {
        Errno::Closed.code()
    }

    pub fn net_set_deadline(_handle: i32, _which: i32, _unix_ns: i64) -> i32 {
        Errno::Closed.code()
    }
}

pub(crate) use imp::*;
