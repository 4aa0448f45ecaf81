//! The host's clocks, through the `clock_now` host import.
//!
//! This module owns the clock ids and the conversions to std types. The
//! wall clock is the one request deadlines are expressed in
//! ([`crate::Ctx::deadline`]); use the monotonic clock to measure
//! durations. Reading a clock is a host call, so a guest that overran its
//! deadline is interrupted there.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::abi::{CLOCK_MONOTONIC, CLOCK_REALTIME};
use crate::sys;

/// Wall-clock time in nanoseconds since the Unix epoch.
pub fn now_unix_ns() -> i64 {
    sys::clock_now(CLOCK_REALTIME)
}

/// Wall-clock time as a [`SystemTime`].
pub fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(now_unix_ns().max(0) as u64)
}

/// Monotonic nanoseconds from an arbitrary origin: only differences mean
/// something.
pub fn monotonic_ns() -> i64 {
    sys::clock_now(CLOCK_MONOTONIC)
}

/// The time elapsed since a [`monotonic_ns`] reading.
pub fn since(start_ns: i64) -> Duration {
    Duration::from_nanos(monotonic_ns().saturating_sub(start_ns).max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_advance() {
        let wall = now_unix_ns();
        assert!(wall > 1_600_000_000_000_000_000, "wall clock {wall}");
        let m = monotonic_ns();
        assert!(m >= 0);
        assert!(monotonic_ns() >= m);
        assert!(since(m) < Duration::from_secs(60));
        assert_eq!(sys::clock_now(7), -1);
    }
}
