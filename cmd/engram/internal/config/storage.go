package config

import "time"

// Engine names accepted by storage.engine.
const (
	EngineBadger = "badger"
	EnginePebble = "pebble"
	EngineMemKV  = "memkv"
	EngineWasm   = "wasm"
	EngineTiKV   = "tikv"
)

// Storage selects the storage engine.
type Storage struct {
	// Engine is "badger" (embedded, durable, the default), "pebble"
	// (embedded, durable, with bounded memory), "memkv" (in-memory, for
	// tests and experiments: everything is lost on exit), "wasm" (a
	// WebAssembly storage plugin, storage.wasm.file) or "tikv" (a TiKV
	// cluster, storage.tikv).
	Engine string `koanf:"engine" help:"storage engine: badger, pebble, memkv, wasm or tikv"`

	// LatestCacheSize bounds the leader's cache of latest object versions,
	// which answers point reads and the checks of every write without an
	// engine lookup (for every engine; worth most on remote ones).
	LatestCacheSize int64 `koanf:"latest-cache-size" help:"bytes of latest object versions the leader keeps in memory for reads and write checks (0 = 64 MiB, negative disables)"`

	// Badger tunes the badger engine; ignored by other engines.
	Badger Badger `koanf:"badger"`

	// Pebble tunes the pebble engine; ignored by other engines.
	Pebble Pebble `koanf:"pebble"`

	// Wasm configures the WebAssembly plugin engine; ignored by others.
	Wasm Wasm `koanf:"wasm"`

	// TiKV configures the TiKV engine; ignored by others.
	TiKV TiKV `koanf:"tikv"`
}

// TiKV configures storage.engine=tikv: Engram's data in a TiKV cluster
// (engines/tikv), reached through its PD servers.
type TiKV struct {
	// PDEndpoints are the PD servers of the cluster, host:port (or
	// http(s)://host:port).
	PDEndpoints []string `koanf:"pd-endpoints" help:"PD servers of the TiKV cluster, host:port (storage.engine=tikv)"`
	// Prefix namespaces this Engram cluster's keys in TiKV, so several can
	// share one TiKV; prefixes sharing a TiKV must not be prefixes of one
	// another.
	Prefix string `koanf:"prefix" help:"key prefix of this Engram cluster in TiKV"`
	// TLS secures the connections to PD and TiKV.
	TLS TiKVTLS `koanf:"tls"`
	// DialTimeout bounds connecting to PD at start.
	DialTimeout time.Duration `koanf:"dial-timeout" help:"how long to wait for PD at start"`
	// RequestTimeout bounds one read, write or region lookup that has no
	// earlier deadline.
	RequestTimeout time.Duration `koanf:"request-timeout" help:"upper bound of one TiKV read or write"`
	// GCInterval is the pause between MVCC garbage collection runs of the
	// TiKV cluster; 0 disables GC (another client, e.g. TiDB, runs it).
	GCInterval time.Duration `koanf:"gc-interval" help:"pause between TiKV MVCC GC runs (0 disables)"`
	// GCLifeTime is the MVCC history GC keeps; it must exceed the longest
	// scan.
	GCLifeTime time.Duration `koanf:"gc-life-time" help:"MVCC history kept by TiKV GC"`
}

// TiKVTLS are PEM files for TLS towards PD and TiKV.
type TiKVTLS struct {
	// CAFile is the CA bundle that signed the cluster's certificates;
	// setting it turns TLS on.
	CAFile string `koanf:"ca-file" help:"PEM CA bundle of the TiKV cluster (enables TLS)"`
	// CertFile and KeyFile are the client certificate and key, for
	// clusters that authenticate clients.
	CertFile string `koanf:"cert-file" help:"PEM client certificate for PD and TiKV"`
	KeyFile  string `koanf:"key-file" help:"PEM private key of storage.tikv.tls.cert-file"`
}

// Wasm configures storage.engine=wasm: a storage plugin loaded from a .wasm
// file (wasm/abi/ABI.md) and run by the host package.
type Wasm struct {
	// File is the plugin's .wasm file.
	File string `koanf:"file" help:"storage plugin .wasm file (storage.engine=wasm)"`
	// SHA256 pins File: Engram refuses to start when the file's SHA-256
	// differs (as sha256sum and `engram plugin info` print it), so the
	// file that runs is the file that was reviewed.
	SHA256 string `koanf:"sha256" help:"refuse to start unless storage.wasm.file has this SHA-256 (64 hex digits)"`
	// Config is passed verbatim to the plugin's init (a DSN, options...).
	Config string `koanf:"config" help:"configuration string passed to the plugin's init"`
	// PoolSize is the number of instances of a pooled plugin (a stateless
	// client of a remote store); a plugin that keeps its data in its own
	// memory always runs as one instance.
	PoolSize int `koanf:"pool-size" help:"instances of a pooled plugin (one-instance plugins ignore it)"`
	// MemoryLimit caps each instance's linear memory, in bytes; a plugin
	// growing past it traps and its instance is discarded.
	MemoryLimit int64 `koanf:"memory-limit" help:"linear memory cap per plugin instance, in bytes"`
	// AllowedAddresses are the host:port strings the plugin may open TCP
	// connections to (exact match, no DNS inside the plugin); anything
	// else is denied.
	AllowedAddresses []string `koanf:"allowed-addresses" help:"host:port addresses the plugin may connect to"`
	// CacheDir holds the compiled plugin, so a restart does not compile
	// again (seconds for a large plugin); empty means <data-dir>/wasm-cache.
	CacheDir string `koanf:"cache-dir" help:"compilation cache directory (empty: <data-dir>/wasm-cache)"`
	// CallTimeout bounds a plugin call that has no earlier deadline.
	CallTimeout time.Duration `koanf:"call-timeout" help:"upper bound of one plugin call"`
	// Untrusted compiles the plugin with interruption checks, so a plugin
	// spinning without calling the host is stopped at its deadline; it
	// makes plugin code several times slower.
	Untrusted bool `koanf:"untrusted" help:"make a spinning plugin interruptible (slows plugin code several times)"`
}

// Badger tunes the embedded badger engine (engines/badger). Every commit is
// fsynced before it is acknowledged; that is not configurable.
type Badger struct {
	// InMemory keeps badger's data in memory only: nothing is written to
	// data-dir, everything is lost on exit, and values are limited to just
	// under 1 MiB (no value log).
	InMemory bool `koanf:"in-memory" help:"run badger without disk (data lost on exit)"`
	// GCInterval is the pause between value-log garbage collection passes;
	// a negative value disables value-log GC.
	GCInterval time.Duration `koanf:"gc-interval" help:"pause between badger value-log GC passes (negative disables)"`
	// Compression compresses table blocks: none (the default, as etcd),
	// snappy or zstd. Compression saves disk on compressible objects but
	// costs memory: badger holds a compressed copy of each block beside the
	// raw one while building tables, and reads need a block cache.
	Compression string `koanf:"compression" help:"badger table compression: none, snappy or zstd (memory for disk)"`
	// BlockCacheSize bounds badger's cache of decompressed table blocks, in
	// bytes; 0 uses the engine's default (none without compression, 64
	// MiB with it).
	BlockCacheSize int64 `koanf:"block-cache-size" help:"badger block cache in bytes (0 = engine default)"`
	// MemTableSize is the size of one badger memtable, in bytes; 0 uses
	// the engine's default (64 MiB). Each memtable costs about 1.3 times
	// this in heap; badger's pooled table-builder buffers, which dominate
	// resident memory after a large load, grow with compaction's tables as
	// much as with this (see engines/badger Options.MemTableSize).
	// One atomic commit is limited to 15% of it: raise it if commits fail
	// with "batch too large" (at 64 MiB, a DeleteRange of about 12000
	// keys is the most one revision can write; at 16 MiB, about 3000).
	MemTableSize int64 `koanf:"memtable-size" help:"badger memtable size in bytes (0 = engine default); caps one commit at 15% of it"`
	// NumMemtables is how many memtables may be full and waiting for a
	// flush before writes wait; 0 uses the engine's default (3).
	NumMemtables int `koanf:"num-memtables" help:"badger memtables allowed before writes wait for a flush (0 = engine default)"`
}

// Pebble tunes the embedded pebble engine (engines/pebble). Every commit is
// fsynced before it is acknowledged; that is not configurable. Its
// memtables and block cache live outside the Go heap, and it reads tables
// through the block cache rather than memory-mapping them, so these two
// sizes bound most of the engine's memory.
type Pebble struct {
	// CacheSize is the block cache (data, index and filter blocks read
	// from tables), in bytes.
	CacheSize int64 `koanf:"cache-size" help:"pebble block cache in bytes"`
	// MemTableSize is the largest memtable, in bytes. At most two exist
	// (one written, one being flushed), and each write-ahead log file is
	// preallocated at 110% of it.
	MemTableSize int64 `koanf:"memtable-size" help:"pebble's largest memtable in bytes (also sizes its write-ahead log files)"`
	// Compression compresses table blocks: none (the default, as etcd),
	// snappy or zstd: disk for CPU on every block read.
	Compression string `koanf:"compression" help:"pebble table compression: none, snappy or zstd (CPU for disk)"`
}
