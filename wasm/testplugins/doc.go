// Package testplugins holds WebAssembly storage plugins built with the
// Engram SDK for the host's tests, the plugin verifier and benchmarks:
// memkv (an ordered in-memory store, instance model single) and faulty (a
// pooled proxy to a remote store that misbehaves on demand). They are built
// by `make plugins` into wasm/testplugins/bin/*.wasm. They are test fixtures,
// not products: the adaptors Engram ships for production live in wasm/adaptors/.
//
// This module must not be imported by Engram itself: plugins are loaded as
// .wasm files, never linked.
package testplugins
