//! Logging to the host's log (the Engram server's structured log, tagged
//! with the plugin's name), through the `log` host import.
//!
//! This module owns the level mapping and the formatting convenience; it
//! keeps no state and no buffer. Writing to stderr works too (the host logs
//! it line by line at warn level), but loses the level.
//!
//! ```ignore
//! engram_plugin::log::info("connected");
//! engram_plugin::log_warn!("slow query: {} ms", ms);
//! ```

use crate::abi::{LOG_DEBUG, LOG_ERROR, LOG_INFO, LOG_WARN};
use crate::sys;

/// A log level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Detail for debugging.
    Debug,
    /// Normal events.
    Info,
    /// Something unexpected that the plugin handled.
    Warn,
    /// Something failed.
    Error,
}

impl Level {
    /// The level's value in the `log` import (log/slog's).
    pub fn code(self) -> i32 {
        match self {
            Level::Debug => LOG_DEBUG,
            Level::Info => LOG_INFO,
            Level::Warn => LOG_WARN,
            Level::Error => LOG_ERROR,
        }
    }
}

/// Writes `msg` to the host's log at `level`.
pub fn log(level: Level, msg: &str) {
    sys::log(level.code(), msg.as_bytes());
}

/// Writes `msg` at debug level.
pub fn debug(msg: &str) {
    log(Level::Debug, msg)
}

/// Writes `msg` at info level.
pub fn info(msg: &str) {
    log(Level::Info, msg)
}

/// Writes `msg` at warn level.
pub fn warn(msg: &str) {
    log(Level::Warn, msg)
}

/// Writes `msg` at error level.
pub fn error(msg: &str) {
    log(Level::Error, msg)
}

/// Formats and writes a message; the macros below call it. Formatting
/// allocates: keep logging off the hot paths.
pub fn log_fmt(level: Level, args: std::fmt::Arguments<'_>) {
    match args.as_str() {
        Some(s) => log(level, s),
        None => log(level, &args.to_string()),
    }
}

/// `log_debug!("fmt", args...)`: formats and logs at debug level.
#[macro_export]
macro_rules! log_debug {
    ($($arg:tt)*) => { $crate::log::log_fmt($crate::log::Level::Debug, format_args!($($arg)*)) };
}

/// `log_info!("fmt", args...)`: formats and logs at info level.
#[macro_export]
macro_rules! log_info {
    ($($arg:tt)*) => { $crate::log::log_fmt($crate::log::Level::Info, format_args!($($arg)*)) };
}

/// `log_warn!("fmt", args...)`: formats and logs at warn level.
#[macro_export]
macro_rules! log_warn {
    ($($arg:tt)*) => { $crate::log::log_fmt($crate::log::Level::Warn, format_args!($($arg)*)) };
}

/// `log_error!("fmt", args...)`: formats and logs at error level.
#[macro_export]
macro_rules! log_error {
    ($($arg:tt)*) => { $crate::log::log_fmt($crate::log::Level::Error, format_args!($($arg)*)) };
}
