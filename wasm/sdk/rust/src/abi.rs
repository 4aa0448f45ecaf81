//! The names and numbers of the plugin ABI, version 1.1 (`wasm/abi/ABI.md` in the
//! Engram repository, the normative text; `wasm/abi/abi.go` is the Go twin of
//! this module): op codes, statuses, instance models, commit op kinds,
//! feature and host flag bits, and the error codes of the host imports.
//!
//! This module owns constants and their conversions only. It does no I/O
//! and holds no state; conversions from wire values return `None` for
//! unknown values instead of panicking.

/// The ABI major version: what `kvp_abi_version` returns, and the suffix of
/// the host import module. A breaking change is a new major.
pub const MAJOR: i32 = 1;

/// The ABI minor version this SDK implements, reported in the manifest.
pub const MINOR: u32 = 1;

/// The import module of the host functions of this major.
pub const HOST_MODULE: &str = "engram_host_v1";

/// Declares an enumeration of one-byte wire values: the enum, whose
/// discriminants are the wire codes, `from_code` (its doc is the last
/// attribute), the only way from a byte to a variant, and `code`. Each code
/// is written once, so the two directions cannot disagree.
macro_rules! wire_enum {
    (
        $(#[$attr:meta])*
        $name:ident {
            $($(#[$vattr:meta])* $variant:ident = $code:literal,)*
        }
        #[doc = $from_doc:literal]
    ) => {
        $(#[$attr])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vattr])* $variant = $code,)*
        }

        impl $name {
            #[doc = $from_doc]
            pub fn from_code(code: u8) -> Option<$name> {
                match code {
                    $($code => Some($name::$variant),)*
                    _ => None,
                }
            }

            /// The wire code.
            pub fn code(self) -> u8 {
                self as u8
            }
        }
    };
}

/// The op code passed to `kvp_dispatch`. Codes are never reused; a plugin
/// answers UNSUPPORTED to codes it does not know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Opcode {
    /// The handshake, first call on every instance.
    Init = 1,
    /// Read one key.
    Get = 2,
    /// Open a scan and return its first batch.
    ScanOpen = 3,
    /// Continue a scan.
    ScanNext = 4,
    /// Release a scan.
    ScanClose = 5,
    /// Apply a batch of writes atomically.
    Commit = 6,
    /// Split a range into parts.
    Partitions = 7,
    /// Release the engine; the last call.
    Close = 8,
    /// Housekeeping while nothing waits.
    Idle = 9,
    /// How many bytes the store's data takes (ABI 1.1).
    Size = 10,
    /// Reclaim space now: etcd's Defragment (ABI 1.1).
    Reclaim = 11,
}

impl Opcode {
    /// Every op of ABI 1.1, in code order.
    pub const ALL: [Opcode; 11] = [
        Opcode::Init,
        Opcode::Get,
        Opcode::ScanOpen,
        Opcode::ScanNext,
        Opcode::ScanClose,
        Opcode::Commit,
        Opcode::Partitions,
        Opcode::Close,
        Opcode::Idle,
        Opcode::Size,
        Opcode::Reclaim,
    ];

    /// The op with wire code `code`, if this ABI version knows it.
    pub fn from_code(code: i32) -> Option<Opcode> {
        Opcode::ALL.iter().copied().find(|op| op.code() == code)
    }

    /// The op with the name the golden vectors use (`"SCAN_OPEN"`).
    pub fn from_name(name: &str) -> Option<Opcode> {
        Opcode::ALL.iter().copied().find(|op| op.name() == name)
    }

    /// The wire code.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// The op's bit in the manifest's `ops`.
    pub fn bit(self) -> u64 {
        1 << (self as u32)
    }

    /// The op's name as in ABI.md (`"SCAN_OPEN"`).
    pub fn name(self) -> &'static str {
        match self {
            Opcode::Init => "INIT",
            Opcode::Get => "GET",
            Opcode::ScanOpen => "SCAN_OPEN",
            Opcode::ScanNext => "SCAN_NEXT",
            Opcode::ScanClose => "SCAN_CLOSE",
            Opcode::Commit => "COMMIT",
            Opcode::Partitions => "PARTITIONS",
            Opcode::Close => "CLOSE",
            Opcode::Idle => "IDLE",
            Opcode::Size => "SIZE",
            Opcode::Reclaim => "RECLAIM",
        }
    }
}

/// The ops every plugin must handle (their bits must be in the manifest).
pub const REQUIRED_OPS: u64 = (1 << 1) | (1 << 2) | (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 8);

wire_enum! {
    /// The first byte of every response.
    Status {
        /// Success; the body is op-specific.
        Ok = 0,
        /// GET of an absent key; no body.
        NotFound = 1,
        /// A COMMIT condition failed; the body names the op.
        Conflict = 2,
        /// A COMMIT whose outcome is unknown; a message follows.
        Uncertain = 3,
        /// The op is not implemented; a message follows.
        Unsupported = 4,
        /// The request was refused as malformed; a message follows.
        Invalid = 5,
        /// The engine is unreachable now, nothing applied; a message follows.
        Unavailable = 6,
        /// The request's deadline passed, nothing applied; a message follows.
        Deadline = 7,
        /// Anything else, nothing applied; a message follows.
        Internal = 8,
    }
    /// The status with wire code `code`, if it is one of this major.
}

impl Status {
    /// Whether responses with this status carry a message body.
    pub fn has_message(self) -> bool {
        !matches!(self, Status::Ok | Status::NotFound | Status::Conflict)
    }

    /// Whether `op` may answer with this status (ABI.md 4.2): NOT_FOUND only
    /// for GET, CONFLICT and UNCERTAIN only for COMMIT.
    pub fn allowed_for(self, op: Opcode) -> bool {
        match self {
            Status::NotFound => op == Opcode::Get,
            Status::Conflict | Status::Uncertain => op == Opcode::Commit,
            _ => true,
        }
    }

    /// The status's name as in ABI.md.
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::NotFound => "NOT_FOUND",
            Status::Conflict => "CONFLICT",
            Status::Uncertain => "UNCERTAIN",
            Status::Unsupported => "UNSUPPORTED",
            Status::Invalid => "INVALID",
            Status::Unavailable => "UNAVAILABLE",
            Status::Deadline => "DEADLINE",
            Status::Internal => "INTERNAL",
        }
    }
}

wire_enum! {
    /// The kind of one write of a COMMIT (`kv.OpKind`'s values).
    OpKind {
        /// Write the value unconditionally.
        Put = 1,
        /// Remove the key; removing an absent key is not an error.
        Delete = 2,
        /// Write the value only if the key is absent.
        PutIfAbsent = 3,
        /// Write the value only if the key holds `expected`.
        CompareAndSwap = 4,
        /// Remove the key only if it holds `expected`.
        CompareAndDelete = 5,
    }
    /// The kind with wire code `code`; any other value is malformed.
}

impl OpKind {
    /// Whether ops of this kind carry a new value.
    pub fn has_value(self) -> bool {
        matches!(self, OpKind::Put | OpKind::PutIfAbsent | OpKind::CompareAndSwap)
    }

    /// Whether ops of this kind carry an expected value.
    pub fn has_expected(self) -> bool {
        matches!(self, OpKind::CompareAndSwap | OpKind::CompareAndDelete)
    }
}

wire_enum! {
    /// The instance model a plugin declares in its manifest (ABI.md section 5).
    Model {
        /// The plugin keeps its data in its own linear memory: the host runs
        /// exactly one instance and serialises every call through it. If that
        /// instance crashes its data is gone, and the host stops serving the
        /// store rather than continue on an empty one.
        Single = 1,
        /// The plugin is a stateless client of a remote store: the host runs a
        /// pool of interchangeable instances (each gets the same INIT) and
        /// replaces crashed ones. A scan stays on the instance that opened it.
        Pooled = 2,
    }
    /// The model with wire code `code`.
}

/// Manifest feature bit: PARTITIONS splits large ranges.
pub const FEATURE_PARTITIONS: u64 = 1 << 0;
/// Manifest feature bit: an acknowledged COMMIT survives a crash.
pub const FEATURE_DURABLE: u64 = 1 << 1;
/// Manifest feature bit: the engine expires keys by itself (advisory).
pub const FEATURE_NATIVE_TTL: u64 = 1 << 2;

/// INIT host flag: the operator allowed at least one network address.
pub const HOST_FLAG_NET: u64 = 1 << 0;

/// SCAN_OPEN flag: descending order. Other bits must be 0.
pub const SCAN_REVERSE: u8 = 1 << 0;

/// Clock id of `clock_now`: wall clock, nanoseconds since the Unix epoch.
pub const CLOCK_REALTIME: i32 = 0;
/// Clock id of `clock_now`: monotonic nanoseconds from an arbitrary origin.
pub const CLOCK_MONOTONIC: i32 = 1;

/// `net_set_deadline` selector: reads and writes.
pub const DEADLINE_BOTH: i32 = 0;
/// `net_set_deadline` selector: reads.
pub const DEADLINE_READ: i32 = 1;
/// `net_set_deadline` selector: writes.
pub const DEADLINE_WRITE: i32 = 2;

/// Log levels of the `log` import (log/slog's values).
pub const LOG_DEBUG: i32 = -4;
/// Info level.
pub const LOG_INFO: i32 = 0;
/// Warn level.
pub const LOG_WARN: i32 = 4;
/// Error level.
pub const LOG_ERROR: i32 = 8;

/// The error codes (negative results) of the `net_*` host imports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Errno {
    /// Capability not granted, or address not allowed.
    Denied = -1,
    /// The peer refused the connection or could not be reached.
    Refused = -2,
    /// A deadline passed: the guest's own, or the request's.
    Timeout = -3,
    /// The peer closed the connection.
    Eof = -4,
    /// Unknown or closed handle.
    Closed = -5,
    /// A pointer or length outside memory, a bad selector.
    Invalid = -6,
    /// Too many open connections in this instance.
    Limit = -7,
    /// Any other I/O error (the host logs the detail).
    Io = -8,
}

impl Errno {
    /// The error of a negative host result; unknown negative codes are
    /// [`Errno::Io`].
    pub fn from_code(code: i32) -> Errno {
        match code {
            -1 => Errno::Denied,
            -2 => Errno::Refused,
            -3 => Errno::Timeout,
            -4 => Errno::Eof,
            -5 => Errno::Closed,
            -6 => Errno::Invalid,
            -7 => Errno::Limit,
            _ => Errno::Io,
        }
    }

    /// The wire code.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// The name as in ABI.md.
    pub fn name(self) -> &'static str {
        match self {
            Errno::Denied => "DENIED",
            Errno::Refused => "REFUSED",
            Errno::Timeout => "TIMEOUT",
            Errno::Eof => "EOF",
            Errno::Closed => "CLOSED",
            Errno::Invalid => "INVALID",
            Errno::Limit => "LIMIT",
            Errno::Io => "IO",
        }
    }
}

/// Packs `kvp_dispatch`'s result: `(ptr << 32) | len`, both unsigned.
pub fn pack_result(ptr: u32, len: u32) -> i64 {
    ((u64::from(ptr) << 32) | u64::from(len)) as i64
}

/// Splits `kvp_dispatch`'s result into pointer and length.
pub fn unpack_result(v: i64) -> (u32, u32) {
    let v = v as u64;
    ((v >> 32) as u32, v as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for op in Opcode::ALL {
            assert_eq!(Opcode::from_code(op.code()), Some(op));
            assert_eq!(Opcode::from_name(op.name()), Some(op));
        }
        assert_eq!(Opcode::from_code(0), None);
        assert_eq!(Opcode::from_code(12), None);
        for c in 0..=8 {
            assert_eq!(Status::from_code(c).map(Status::code), Some(c));
        }
        assert_eq!(Status::from_code(9), None);
        assert_eq!(REQUIRED_OPS, 0x17e);
        assert_eq!(REQUIRED_OPS | Opcode::Partitions.bit() | Opcode::Idle.bit(), 0x3fe);
        assert_eq!(unpack_result(pack_result(0xfedc_ba98, 0x7654_3210)), (0xfedc_ba98, 0x7654_3210));
        assert_eq!(Errno::from_code(-100), Errno::Io);
    }
}
