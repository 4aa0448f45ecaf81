// Package warmwasm compiles wasm plugins into the compilation caches the
// tests share (proctest.WasmCacheDir) before the tests run; its only code is
// TestWarm, which `make test` runs first with ENGRAM_WARM_WASM naming the
// plugin files.
//
// Why: the tests that load a database adaptor run under the race detector,
// where wazero's instrumented compiler takes about 80 s more for an adaptor
// that links a database driver than an uninstrumented compilation (about
// 9 s). The compiled code does not depend on how the host was built, so an
// entry written by an uninstrumented test binary is the one the
// instrumented tests look up. It has to be a test binary: wazero keys its
// cache by its own version, which it reads from the binary's build
// information, and test binaries carry none, so they all use the version
// "dev" (a `go run` program would write entries no test reads).
//
// A plugin already in its cache is left alone. Where warming fails, the
// tests compile the plugin themselves, slowly but correctly.
package warmwasm
