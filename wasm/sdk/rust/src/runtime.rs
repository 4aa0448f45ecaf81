//! The module's export surface (ABI.md section 2): the request buffer that
//! `kvp_buffer` hands out and the `kvp_dispatch` entry, around a
//! [`Dispatcher`].
//!
//! This module owns the request buffer and the one plugin instance of the
//! wasm module. [`Runtime`] is plain Rust and runs natively in tests; the
//! `__private` functions that [`crate::export_store!`] calls (wasm only)
//! keep the runtime in a thread-local and turn pointers into the `i32` and
//! `i64` values of the exports. Nothing here may panic: the exports return
//! 0 (a failed `kvp_buffer`; an empty response, which the host treats as a
//! crash) in the cases that cannot happen in a conforming host, such as a
//! re-entrant call.

use crate::dispatch::Dispatcher;
use crate::store::Store;

/// The request buffer's smallest size: most requests fit, so the host
/// rarely needs to ask for a bigger one.
pub const MIN_REQUEST_BUFFER: usize = 64 << 10;

/// A store behind a dispatcher, with the request buffer the host writes
/// requests into. One per wasm instance.
pub struct Runtime<S: Store> {
    req: Vec<u8>,
    disp: Dispatcher<S>,
}

impl<S: Store> Runtime<S> {
    /// A runtime serving `store`.
    pub fn new(store: S) -> Self {
        Runtime { req: Vec::new(), disp: Dispatcher::new(store) }
    }

    /// `kvp_buffer`: the request buffer, with room for at least `min_cap`
    /// bytes, or `None` if `min_cap` is negative or memory ran out (the
    /// export then returns 0, which ABI.md allows). The buffer stays put
    /// until a call asks for more than it holds.
    pub fn buffer(&mut self, min_cap: i32) -> Option<&mut [u8]> {
        let min = usize::try_from(min_cap).ok()?;
        if self.req.is_empty() || self.req.len() < min {
            let want = min.max(MIN_REQUEST_BUFFER);
            // Free the old buffer first: memory is capped and never
            // shrinks, so holding both would raise the high-water mark.
            self.req = Vec::new();
            let mut b = Vec::new();
            b.try_reserve_exact(want).ok()?;
            b.resize(want, 0);
            self.req = b;
        }
        Some(&mut self.req)
    }

    /// `kvp_dispatch`: handles the `req_len` bytes at the start of the
    /// request buffer as a request of op `op`; the response stays valid
    /// until the next call.
    pub fn dispatch(&mut self, op: i32, req_len: i32) -> &[u8] {
        let req = usize::try_from(req_len).ok().and_then(|n| self.req.get(..n));
        match req {
            Some(req) => self.disp.dispatch(op, req),
            None => self.disp.bad_length(),
        }
    }

    /// The dispatcher.
    pub fn dispatcher(&mut self) -> &mut Dispatcher<S> {
        &mut self.disp
    }
}

/// What the exports need of a runtime, without its store type, so that one
/// non-generic thread-local can hold it.
#[cfg(target_arch = "wasm32")]
trait Plugin {
    fn buffer(&mut self, min_cap: i32) -> i32;
    fn dispatch(&mut self, op: i32, req_len: i32) -> i64;
}

#[cfg(target_arch = "wasm32")]
impl<S: Store> Plugin for Runtime<S> {
    fn buffer(&mut self, min_cap: i32) -> i32 {
        // wasm32 pointers are 32-bit: the cast is lossless there.
        Runtime::buffer(self, min_cap).map_or(0, |b| b.as_mut_ptr() as usize as u32 as i32)
    }

    fn dispatch(&mut self, op: i32, req_len: i32) -> i64 {
        let resp = Runtime::dispatch(self, op, req_len);
        crate::abi::pack_result(resp.as_ptr() as usize as u32, resp.len() as u32)
    }
}

/// The functions [`crate::export_store!`] expands to calls of. Not API.
#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod __private {
    use super::{Plugin, Runtime};
    use crate::store::Store;
    use std::cell::RefCell;

    thread_local! {
        // The instance's plugin, made by the first export call. A wasm
        // instance has one thread and the host calls it one call at a
        // time, so the RefCell is never contended; a re-entrant call
        // (forbidden by ABI.md) finds it borrowed and gets 0.
        static PLUGIN: RefCell<Option<Box<dyn Plugin>>> = RefCell::new(None);
    }

    fn with<S, R>(make: impl FnOnce() -> S, f: impl FnOnce(&mut (dyn Plugin + 'static)) -> R) -> Option<R>
    where
        S: Store + 'static,
    {
        PLUGIN
            .try_with(|cell| {
                let mut slot = cell.try_borrow_mut().ok()?;
                if slot.is_none() {
                    *slot = Some(Box::new(Runtime::new(make())));
                }
                slot.as_deref_mut().map(f)
            })
            .ok()
            .flatten()
    }

    /// `kvp_buffer(min_cap) -> ptr`.
    pub fn buffer<S: Store + 'static>(min_cap: i32, make: impl FnOnce() -> S) -> i32 {
        with(make, |p| p.buffer(min_cap)).unwrap_or(0)
    }

    /// `kvp_dispatch(op, req_len) -> ptr << 32 | len`.
    pub fn dispatch<S: Store + 'static>(op: i32, req_len: i32, make: impl FnOnce() -> S) -> i64 {
        with(make, |p| p.dispatch(op, req_len)).unwrap_or(0)
    }
}
