//! Turns a Rust type into an Engram storage plugin: a WebAssembly module
//! that Engram loads at run time instead of a compiled-in engine.
//!
//! A plugin implements [`Store`] and exports it:
//!
//! ```ignore
//! use engram_plugin::{Store, export_store};
//!
//! struct MyStore { /* ... */ }
//! impl Store for MyStore { /* init, get, scan, scan_next, commit, close */ }
//!
//! export_store!(MyStore::new());
//! ```
//!
//! built as a `cdylib` for `wasm32-wasip1` (`wasm32-wasi` before Rust 1.78),
//! and checked with `engram plugin verify my.wasm`, which runs Engram's
//! adaptor conformance suite against it. The contract is `wasm/abi/ABI.md` in the
//! Engram repository; this crate is its Rust side, as `wasm/sdk/` is its Go side.
//!
//! # Modules
//!
//! - [`Store`] and its types ([`Manifest`], [`Error`], [`Ctx`],
//!   [`BatchWriter`], ...): what a plugin implements.
//! - [`export_store!`] and [`runtime`]: the exports `kvp_abi_version`,
//!   `kvp_buffer` and `kvp_dispatch`, and the request buffer.
//! - [`dispatch`]: request handling, independent of wasm.
//! - [`abi`], [`codec`], [`messages`]: the wire format, usable on its own
//!   (a Rust host, tests, tools).
//! - [`log`], [`clock`], [`net`]: safe wrappers of the host imports
//!   (module `engram_host_v1`).
//!
//! The codec, the dispatcher and their tests compile and run natively;
//! only the exports and the host imports are wasm-only (natively the
//! imports are stand-ins: stderr, the process's clocks, sockets denied).
//!
//! # One call at a time
//!
//! The host calls an instance for one request at a time, from one thread,
//! and nothing in the instance runs between calls: there are no background
//! threads or timers in a plugin. Do all work inside the [`Store`] methods.
//!
//! # Ownership and lifetimes
//!
//! The SDK owns two buffers, reused across calls: the request buffer (the
//! host writes each request there) and the response buffer. Every slice a
//! store method receives (keys, values, [`Op`] fields, scan bounds, the
//! config) borrows the request buffer and is valid for that call only: copy
//! what you keep. Slices a store returns or pushes are copied into the
//! response before the call ends. In steady state a request allocates
//! nothing in the SDK.
//!
//! # Instance models (ABI.md section 5)
//!
//! The [`Manifest`]'s [`Model`] decides how many instances the host runs.
//! [`Model::Single`]: the plugin keeps its data in its own linear memory;
//! the host runs exactly one instance and serialises every call through it;
//! if that instance crashes (a trap, a panic, running out of memory) its
//! data is gone, and the host stops serving the store rather than continue
//! on an empty one. [`Model::Pooled`]: the plugin is a stateless client of a
//! remote store; the host runs several interchangeable instances, each with
//! the same INIT, and replaces crashed ones. A scan is always continued on
//! the instance that opened it, so per-scan state may live in the instance.
//!
//! # Deadlines
//!
//! Every request carries the caller's deadline ([`Ctx::deadline`]), and the
//! host applies it to every socket call made while serving the request: a
//! read blocked past it fails with [`std::io::ErrorKind::TimedOut`]. A call
//! that runs far past its deadline is interrupted at its next host call and
//! the instance is discarded; a guest that spins without host calls cannot
//! be interrupted unless the operator runs it as untrusted. Do not spin.
//!
//! # Panics
//!
//! A panic aborts on `wasm32-wasi`, which traps the instance: the host
//! treats it as a crash. The SDK never panics on malformed requests (it
//! answers INVALID); a store must not panic either, and should return an
//! [`Error`].
//!
//! # Memory
//!
//! The operator caps an instance's linear memory; growing past it traps.
//! Linear memory never shrinks, so the high-water mark is what a plugin
//! costs. Keep batches bounded ([`Manifest`] limits) and caches bounded.

#![deny(missing_docs)]

pub mod abi;
pub mod clock;
pub mod codec;
pub mod dispatch;
pub mod log;
pub mod messages;
pub mod net;
pub mod runtime;
mod store;
mod sys;

pub use crate::abi::{Model, OpKind};
pub use crate::dispatch::Dispatcher;
pub use crate::messages::Op;
pub use crate::runtime::Runtime;
pub use crate::store::{
    BatchWriter, Ctx, Error, HostInfo, Manifest, PartitionWriter, Progress, ScanOptions, Store,
};

/// Defines the plugin's exports (`kvp_abi_version`, `kvp_buffer`,
/// `kvp_dispatch`) in the calling crate, serving the store that `$make`
/// builds. `$make` runs once, on the host's first call, before INIT.
///
/// Call it once, at the top level of the `cdylib` crate:
///
/// ```ignore
/// engram_plugin::export_store!(MyStore::default());
/// ```
///
/// The exports are defined by the plugin crate rather than by this library
/// because a `cdylib` only reliably exports the `#[no_mangle]` functions of
/// its own crate. Outside wasm the macro defines no export and only
/// type-checks `$make`, so a plugin's native unit tests build.
#[macro_export]
macro_rules! export_store {
    ($make:expr) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            #[no_mangle]
            pub extern "C" fn kvp_abi_version() -> i32 {
                $crate::abi::MAJOR
            }

            #[no_mangle]
            pub extern "C" fn kvp_buffer(min_cap: i32) -> i32 {
                $crate::runtime::__private::buffer(min_cap, || $make)
            }

            #[no_mangle]
            pub extern "C" fn kvp_dispatch(op: i32, req_len: i32) -> i64 {
                $crate::runtime::__private::dispatch(op, req_len, || $make)
            }
        };

        #[cfg(not(target_arch = "wasm32"))]
        const _: () = {
            #[allow(dead_code)]
            fn engram_check_store() {
                $crate::assert_store(|| $make);
            }
        };
    };
}

/// Checks at compile time that `make` builds a [`Store`]; used by
/// [`export_store!`] outside wasm.
#[doc(hidden)]
pub fn assert_store<S: Store + 'static>(make: impl FnOnce() -> S) {
    let _ = make;
}
