//! TCP connections through the host (`net_*` imports): the only network
//! access a plugin has.
//!
//! This module owns socket handles and the mapping of the host's error codes
//! to [`std::io::Error`]s, so that drivers written against `Read + Write`
//! work unchanged. It does not resolve names (there is no DNS in the
//! plugin: pass an address exactly as the operator listed it in
//! `storage.wasm.allowed-addresses`), does no TLS and no buffering.
//!
//! **Deadlines come from the host**: while serving a request the host bounds
//! every socket call by the request's deadline (a blocked read returns
//! [`std::io::ErrorKind::TimedOut`]), in addition to the connection's own
//! deadlines set here; the earlier wins. Connections stay open across
//! requests: they belong to the instance and die with it.

use std::fmt;
use std::io;
use std::time::Duration;

use crate::abi::{Errno, DEADLINE_BOTH, DEADLINE_READ, DEADLINE_WRITE};
use crate::sys;

/// A host error code as an error value, the source of the
/// [`io::Error`]s this module returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostError(pub Errno);

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.0 {
            Errno::Denied => "address not allowed by the host (storage.wasm.allowed-addresses)",
            Errno::Refused => "connection refused or unreachable",
            Errno::Timeout => "deadline exceeded",
            Errno::Eof => "connection closed by the peer",
            Errno::Closed => "connection closed",
            Errno::Invalid => "invalid argument to a host socket call",
            Errno::Limit => "too many open connections in this instance",
            Errno::Io => "I/O error (see the host's log)",
        };
        write!(f, "{} ({} {})", what, self.0.name(), self.0.code())
    }
}

impl std::error::Error for HostError {}

/// The [`io::Error`] for a negative host result.
pub fn errno_error(code: i32) -> io::Error {
    let e = Errno::from_code(code);
    let kind = match e {
        Errno::Denied => io::ErrorKind::PermissionDenied,
        Errno::Refused => io::ErrorKind::ConnectionRefused,
        Errno::Timeout => io::ErrorKind::TimedOut,
        Errno::Eof => io::ErrorKind::UnexpectedEof,
        Errno::Closed => io::ErrorKind::NotConnected,
        Errno::Invalid => io::ErrorKind::InvalidInput,
        Errno::Limit | Errno::Io => io::ErrorKind::Other,
    };
    io::Error::new(kind, HostError(e))
}

/// Which direction a deadline applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Reads and writes.
    Both,
    /// Reads.
    Read,
    /// Writes.
    Write,
}

/// A TCP connection opened by the host. Reads block until at least one
/// byte, EOF, an error or a deadline; writes write everything or fail.
/// Dropping it closes it.
#[derive(Debug)]
pub struct TcpConn {
    handle: i32,
    closed: bool,
}

impl TcpConn {
    /// Connects to `addr` (`host:port`, exactly as the operator allowed
    /// it). `timeout` bounds the dial; `None` leaves it to the request's
    /// deadline, which the host applies anyway.
    pub fn connect(addr: &str, timeout: Option<Duration>) -> io::Result<TcpConn> {
        if addr.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty address"));
        }
        let ms = match timeout {
            None => 0,
            Some(d) if d.is_zero() => {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "dial timeout is zero"));
            }
            // At least 1 ms: 0 would mean "the request's deadline".
            Some(d) => i32::try_from(d.as_millis()).unwrap_or(i32::MAX).max(1),
        };
        let h = sys::net_dial(addr.as_bytes(), ms);
        if h < 0 {
            return Err(errno_error(h));
        }
        Ok(TcpConn { handle: h, closed: false })
    }

    /// Connects within what is left of a request's deadline.
    pub fn connect_within(addr: &str, cx: &crate::Ctx) -> io::Result<TcpConn> {
        match cx.timeout() {
            Some(d) if d.is_zero() => Err(io::Error::new(io::ErrorKind::TimedOut, "the request's deadline passed")),
            t => TcpConn::connect(addr, t),
        }
    }

    /// The host's handle, for diagnostics.
    pub fn handle(&self) -> i32 {
        self.handle
    }

    /// Sets the connection's own deadline for `dir`, in nanoseconds since
    /// the Unix epoch ([`crate::clock::now_unix_ns`]); `None` clears it.
    /// The request's deadline still applies on top.
    pub fn set_deadline(&self, dir: Direction, unix_ns: Option<i64>) -> io::Result<()> {
        self.check_open()?;
        let which = match dir {
            Direction::Both => DEADLINE_BOTH,
            Direction::Read => DEADLINE_READ,
            Direction::Write => DEADLINE_WRITE,
        };
        // A deadline in the past must still mean "expired", never "none".
        let ns = unix_ns.map_or(0, |t| t.max(1));
        let rc = sys::net_set_deadline(self.handle, which, ns);
        if rc < 0 {
            return Err(errno_error(rc));
        }
        Ok(())
    }

    /// Sets read and write deadlines `d` from now; `None` clears them.
    pub fn set_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        let at = d.map(|d| {
            let ns = i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
            crate::clock::now_unix_ns().saturating_add(ns)
        });
        self.set_deadline(Direction::Both, at)
    }

    /// Closes the connection, reporting an error the host returned. Drop
    /// closes too, ignoring errors.
    pub fn close(mut self) -> io::Result<()> {
        self.close_handle()
    }

    fn close_handle(&mut self) -> io::Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        let rc = sys::net_close(self.handle);
        if rc < 0 && rc != Errno::Closed.code() {
            return Err(errno_error(rc));
        }
        Ok(())
    }

    fn check_open(&self) -> io::Result<()> {
        if self.closed {
            Err(errno_error(Errno::Closed.code()))
        } else {
            Ok(())
        }
    }
}

/// The largest chunk passed to one host call: lengths are `i32` results.
const MAX_CHUNK: usize = 1 << 30;

impl io::Read for TcpConn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.check_open()?;
        if buf.is_empty() {
            return Ok(0);
        }
        let len = buf.len().min(MAX_CHUNK);
        let n = sys::net_read(self.handle, &mut buf[..len]);
        if n == Errno::Eof.code() {
            return Ok(0);
        }
        if n < 0 {
            return Err(errno_error(n));
        }
        // The host never reports more than it was given room for; clamp
        // anyway so a bad host cannot make a caller slice out of bounds.
        Ok((n as usize).min(len))
    }
}

impl io::Write for TcpConn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.check_open()?;
        if buf.is_empty() {
            return Ok(0);
        }
        let len = buf.len().min(MAX_CHUNK);
        let n = sys::net_write(self.handle, &buf[..len]);
        if n < 0 {
            if n == Errno::Eof.code() {
                return Err(io::Error::new(io::ErrorKind::BrokenPipe, HostError(Errno::Eof)));
            }
            return Err(errno_error(n));
        }
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "host wrote 0 bytes"));
        }
        Ok((n as usize).min(len))
    }

    fn flush(&mut self) -> io::Result<()> {
        // Nothing is buffered in the guest.
        Ok(())
    }
}

impl Drop for TcpConn {
    fn drop(&mut self) {
        // Nobody to report to; the host frees the handle either way.
        let _ = self.close_handle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn errors_map_to_io_kinds() {
        assert_eq!(errno_error(-1).kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(errno_error(-2).kind(), io::ErrorKind::ConnectionRefused);
        assert_eq!(errno_error(-3).kind(), io::ErrorKind::TimedOut);
        assert_eq!(errno_error(-5).kind(), io::ErrorKind::NotConnected);
        assert_eq!(errno_error(-6).kind(), io::ErrorKind::InvalidInput);
        assert_eq!(errno_error(-7).kind(), io::ErrorKind::Other);
        assert!(errno_error(-3).to_string().contains("TIMEOUT"));
        assert_eq!(crate::Error::from(errno_error(-3)).status(), crate::abi::Status::Deadline);
        assert_eq!(crate::Error::from(errno_error(-2)).status(), crate::abi::Status::Unavailable);
    }

    #[test]
    fn native_stand_in_denies_and_closed_conns_refuse() {
        // Natively the host is a stand-in that grants nothing.
        let e = TcpConn::connect("127.0.0.1:1", None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(TcpConn::connect("", None).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        let mut c = TcpConn { handle: 3, closed: true };
        assert_eq!(c.read(&mut [0; 4]).unwrap_err().kind(), io::ErrorKind::NotConnected);
        assert_eq!(c.write(b"x").unwrap_err().kind(), io::ErrorKind::NotConnected);
        assert!(c.close().is_ok());
    }
}
