// Package config defines, loads and validates the configuration of the engram
// server binary.
//
// It owns the one authoritative list of settings: the Config struct below.
// Every key's name, default, flag, environment variable and one-line help text
// is derived from that struct, and config.example.yaml at the repository root
// mirrors it (a unit test keeps the two in step). Values are layered, later
// layers winning:
//
//	defaults < YAML file (--config FILE or ENGRAM_CONFIG) < ENGRAM_* environment variables < command-line flags
//
// This package must not open storage, listen on sockets or start anything: it
// only turns arguments, environment and files into a validated Config, so the
// rules stay testable without a server.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/engramkv/engram/host"
)

// Config is the complete configuration of `engram serve`.
//
// Each field carries a `koanf` tag (its key; nested structs add a dotted
// prefix) and a `help` tag (the one-line text shown by --help). The doc
// comments say more where one line is not enough.
type Config struct {
	// Name is this member's name, reported by MemberList and Status (etcd:
	// --name).
	Name string `koanf:"name" help:"member name reported in member list and status"`

	// ListenClientURLs are the addresses the etcd v3 gRPC API is served on.
	// Schemes: http:// (plaintext TCP), https:// (TLS, needs tls.cert-file
	// and tls.key-file) and unix:///abs/path or unix:rel/path (a plaintext
	// unix socket, access controlled by file permissions). TCP URLs are
	// host:port with no path; port 0 picks a free port (logged at start).
	ListenClientURLs []string `koanf:"listen-client-urls" help:"URLs to serve the etcd v3 gRPC API on (http://, https://, unix://)"`

	// AdvertiseClientURLs are the client URLs reported in MemberList. Empty
	// means "the listen-client-urls" (with a port 0 replaced by the port
	// actually bound).
	AdvertiseClientURLs []string `koanf:"advertise-client-urls" help:"client URLs reported in member list (default: listen-client-urls)"`

	// DataDir holds the storage engine's files; the badger engine keeps them
	// in DataDir/badger. Unused by memkv.
	DataDir string `koanf:"data-dir" help:"directory for persistent data"`

	// Storage selects and tunes the storage engine.
	Storage Storage `koanf:"storage"`

	// TLS configures transport security for https:// listeners.
	TLS TLS `koanf:"tls"`

	// HTTP configures the operational HTTP endpoint.
	HTTP HTTP `koanf:"http"`

	// Log configures the structured logger (log/slog, on stderr).
	Log Log `koanf:"log"`

	// Watch tunes the watch service.
	Watch Watch `koanf:"watch"`

	// Compaction is the optional server-side compaction policy.
	Compaction Compaction `koanf:"compaction"`

	// Limits bound request sizes.
	Limits Limits `koanf:"limits"`

	// Cluster runs several Engram nodes over one shared store.
	Cluster Cluster `koanf:"cluster"`

	// ShutdownTimeout bounds the graceful part of a shutdown: how long
	// in-flight gRPC calls may run on after SIGTERM/SIGINT before the
	// remaining connections are cut. Open watch streams never end on their
	// own, so with watchers connected shutdown takes this long. It also
	// bounds the server's own drain (finishing in-flight writes).
	ShutdownTimeout time.Duration `koanf:"shutdown-timeout" help:"how long a graceful shutdown waits for in-flight calls before cutting connections"`

	// MemoryLimit is the Go runtime's soft memory limit in bytes
	// (debug.SetMemoryLimit): the garbage collector runs more often as the
	// process nears it and returns freed memory to the OS, instead of
	// letting the heap grow to twice its live size (GOGC=100). It is soft:
	// a live heap above it is not an error, only more GC work (the runtime
	// caps that at about half the CPU). 0 sets it to 90% of the memory
	// limit of the process's cgroup (its container), or of the machine's
	// memory outside one; a negative value disables it; the GOMEMLIMIT
	// environment variable, when set, wins over this key.
	MemoryLimit int64 `koanf:"memory-limit" help:"soft memory limit of the Go runtime in bytes (0 = 90% of the container's or machine's memory, negative disables; GOMEMLIMIT wins)"`
}

// Storage selects the storage engine.
type Storage struct {
	// Engine is "badger" (embedded, durable, the default), "memkv"
	// (in-memory, for tests and experiments: everything is lost on exit),
	// "wasm" (a WebAssembly storage plugin, storage.wasm.file) or "tikv"
	// (a TiKV cluster, storage.tikv).
	Engine string `koanf:"engine" help:"storage engine: badger, memkv, wasm or tikv"`

	// LatestCacheSize bounds the leader's cache of latest object versions,
	// which answers point reads and the checks of every write without an
	// engine lookup (for every engine; worth most on remote ones).
	LatestCacheSize int64 `koanf:"latest-cache-size" help:"bytes of latest object versions the leader keeps in memory for reads and write checks (0 = 64 MiB, negative disables)"`

	// Badger tunes the badger engine; ignored by other engines.
	Badger Badger `koanf:"badger"`

	// Wasm configures the WebAssembly plugin engine; ignored by others.
	Wasm Wasm `koanf:"wasm"`

	// TiKV configures the TiKV engine; ignored by others.
	TiKV TiKV `koanf:"tikv"`
}

// TiKV configures storage.engine=tikv: Engram's data in a TiKV cluster
// (plugins/tikv), reached through its PD servers.
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
// file (abi/ABI.md) and run by the host package.
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

// Badger tunes the embedded badger engine (plugins/badger). Every commit is
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
	// much as with this (see plugins/badger Options.MemTableSize).
	// One atomic commit is limited to 15% of it: raise it if commits fail
	// with "batch too large" (at 64 MiB, a DeleteRange of about 12000
	// keys is the most one revision can write; at 16 MiB, about 3000).
	MemTableSize int64 `koanf:"memtable-size" help:"badger memtable size in bytes (0 = engine default); caps one commit at 15% of it"`
	// NumMemtables is how many memtables may be full and waiting for a
	// flush before writes wait; 0 uses the engine's default (3).
	NumMemtables int `koanf:"num-memtables" help:"badger memtables allowed before writes wait for a flush (0 = engine default)"`
}

// TLS configures the certificates of https:// listeners.
type TLS struct {
	// CertFile is the PEM server certificate (chain) for https:// listeners.
	CertFile string `koanf:"cert-file" help:"PEM server certificate for https:// listeners"`
	// KeyFile is the PEM private key of CertFile.
	KeyFile string `koanf:"key-file" help:"PEM private key of tls.cert-file"`
	// ClientCAFile, when set, turns on client certificate authentication:
	// every TLS client must present a certificate signed by one of these
	// CAs (kube-apiserver: --etcd-certfile/--etcd-keyfile). Plaintext
	// http:// listeners are then refused, since they would bypass it.
	ClientCAFile string `koanf:"client-ca-file" help:"PEM CA bundle; when set, TLS clients must present a certificate it signed"`
}

// HTTP configures the operational endpoint: /metrics (Prometheus),
// /healthz (the process is up), /readyz (the server has recovered its state
// and is serving) and /debug/pprof/.
type HTTP struct {
	// Listen is the host:port of the endpoint; empty disables it. It serves
	// profiling data, so keep it on a loopback or otherwise private address.
	Listen string `koanf:"listen" help:"host:port for /metrics, /healthz, /readyz, /debug/pprof/ (empty disables)"`
}

// Log configures logging.
type Log struct {
	// Level is debug, info, warn or error.
	Level string `koanf:"level" help:"log level: debug, info, warn or error"`
	// Format is text or json.
	Format string `koanf:"format" help:"log format: text or json"`
}

// Watch tunes the watch service.
type Watch struct {
	// ProgressNotifyInterval is how often an idle watch created with
	// progress_notify gets a progress response (etcd:
	// --experimental-watch-progress-notify-interval).
	ProgressNotifyInterval time.Duration `koanf:"progress-notify-interval" help:"interval of progress notifications on idle watches"`
	// MaxLag is how many revisions a watcher may fall behind the head
	// before it is cancelled (the client then re-watches); 0 means the
	// server's built-in default, a negative value disables the limit.
	MaxLag int64 `koanf:"max-lag" help:"revisions a watcher may fall behind before it is cancelled (0 = built-in default, negative = no limit)"`
}

// Compaction is the server-side compaction policy. kube-apiserver compacts
// on its own (every 5 minutes by default), so the default is off.
type Compaction struct {
	// Mode is "" (off), "periodic" (keep Retention worth of history) or
	// "revision" (keep the last Revisions revisions).
	Mode string `koanf:"mode" help:"server-side compaction: \"\" (off), periodic or revision"`
	// Retention is the history kept by "periodic" mode, e.g. 1h.
	Retention time.Duration `koanf:"retention" help:"history kept by periodic compaction (e.g. 1h)"`
	// Revisions is the number of revisions kept by "revision" mode.
	Revisions int64 `koanf:"revisions" help:"revisions kept by revision compaction"`
	// Interval is how often the policy runs; 0 lets the server choose
	// (periodic: a tenth of Retention, between 1s and 1h; revision: 5m).
	Interval time.Duration `koanf:"interval" help:"how often server-side compaction runs (0 = chosen from the mode)"`
}

// Cluster configures leader election among Engram nodes that share one
// store (TiKV, a remote database behind a wasm plugin). Each node needs a
// distinct, stable name and an advertise-client-urls entry its peers can
// reach: followers forward writes, leases and watches there.
type Cluster struct {
	// Enabled turns the election on. Leave it off for badger and memkv:
	// nothing else can open their store.
	Enabled bool `koanf:"enabled" help:"elect a leader among nodes sharing the store"`
	// LeaseDuration bounds failover: a dead leader is replaced within it.
	LeaseDuration time.Duration `koanf:"lease-duration" help:"leader lease; a new leader takes over within about this time"`
	// RenewInterval is how often the leader renews its lease.
	RenewInterval time.Duration `koanf:"renew-interval" help:"how often the leader renews its lease (at most half the lease)"`
	// TLS is what a follower presents when forwarding to an https:// leader.
	TLS ClusterTLS `koanf:"tls"`
}

// ClusterTLS is the client side of follower-to-leader forwarding.
type ClusterTLS struct {
	CAFile   string `koanf:"ca-file" help:"PEM CA that signed the members' server certificates"`
	CertFile string `koanf:"cert-file" help:"PEM client certificate for forwarding (needed when members require client certificates)"`
	KeyFile  string `koanf:"key-file" help:"PEM private key of cluster.tls.cert-file"`
}

// Limits bound requests, as etcd's flags of the same names do.
type Limits struct {
	// MaxRequestBytes bounds one gRPC request (etcd: --max-request-bytes).
	MaxRequestBytes int `koanf:"max-request-bytes" help:"largest accepted request in bytes"`
	// MaxTxnOps bounds the operations of one Txn (etcd: --max-txn-ops).
	MaxTxnOps int `koanf:"max-txn-ops" help:"most operations in one transaction"`
}

// Engine names accepted by storage.engine.
const (
	EngineBadger = "badger"
	EngineMemKV  = "memkv"
	EngineWasm   = "wasm"
	EngineTiKV   = "tikv"
)

// Default returns the built-in defaults: the first, lowest layer.
func Default() Config {
	return Config{
		Name:             "default",
		ListenClientURLs: []string{"http://127.0.0.1:2379"},
		DataDir:          "./data",
		Storage: Storage{Engine: EngineBadger, Badger: Badger{
			GCInterval:   10 * time.Minute,
			Compression:  "none",
			MemTableSize: 64 << 20,
			NumMemtables: 3,
		}, Wasm: Wasm{
			PoolSize:    4,
			MemoryLimit: 256 << 20,
			CallTimeout: 10 * time.Second,
		}, TiKV: TiKV{
			Prefix:         "engram/",
			DialTimeout:    10 * time.Second,
			RequestTimeout: 30 * time.Second,
			GCInterval:     10 * time.Minute,
			GCLifeTime:     10 * time.Minute,
		}},
		HTTP:  HTTP{Listen: "127.0.0.1:2381"},
		Log:   Log{Level: "info", Format: "text"},
		Watch: Watch{ProgressNotifyInterval: 10 * time.Minute},
		// etcd's defaults: 1.5 MiB and 128 operations.
		Limits:          Limits{MaxRequestBytes: 1536 * 1024, MaxTxnOps: 128},
		Cluster:         Cluster{LeaseDuration: 5 * time.Second, RenewInterval: 1250 * time.Millisecond},
		ShutdownTimeout: 5 * time.Second,
		// Automatic (90% of the container's or machine's memory) rather than
		// a fixed size: a fixed limit below the live heap makes the collector
		// run without pause. Loading a million 512-byte objects into badger
		// (2 cores) leaves 0.8-1.26 GiB live, mostly badger's pooled
		// table-builder buffers; a 1 GiB limit cut RSS from 2.0 to 0.79 GiB
		// but cost +85% server CPU and -38% load rate during that load, and
		// a cluster with more data would pay it all the time.
		MemoryLimit: 0,
	}
}

// Validate checks every rule that does not need the filesystem or network
// and returns all violations at once, each naming its key.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}

	if strings.TrimSpace(c.Name) == "" {
		bad("name", "must not be empty")
	}

	tlsOn := c.TLS.CertFile != "" || c.TLS.KeyFile != ""
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		bad("tls.cert-file", "tls.cert-file and tls.key-file must be set together")
	}
	if c.TLS.ClientCAFile != "" && !tlsOn {
		bad("tls.client-ca-file", "client certificate authentication needs tls.cert-file and tls.key-file")
	}

	if len(c.ListenClientURLs) == 0 {
		bad("listen-client-urls", "at least one URL is required")
	}
	anyHTTPS := false
	for _, raw := range c.ListenClientURLs {
		u, err := ParseClientURL(raw)
		if err != nil {
			bad("listen-client-urls", "%v", err)
			continue
		}
		switch u.Scheme {
		case "https":
			anyHTTPS = true
			if !tlsOn {
				bad("listen-client-urls", "%s needs tls.cert-file and tls.key-file", raw)
			}
		case "http":
			if c.TLS.ClientCAFile != "" {
				bad("listen-client-urls", "%s is plaintext, which would bypass the client certificate authentication tls.client-ca-file asks for; use https://", raw)
			}
		}
	}
	if tlsOn && !anyHTTPS && len(c.ListenClientURLs) > 0 {
		bad("tls.cert-file", "is set but no listen-client-urls entry uses https://")
	}
	for _, raw := range c.AdvertiseClientURLs {
		if _, err := ParseClientURL(raw); err != nil {
			bad("advertise-client-urls", "%v", err)
		}
	}

	switch c.Storage.Engine {
	case EngineBadger:
		if !c.Storage.Badger.InMemory && strings.TrimSpace(c.DataDir) == "" {
			bad("data-dir", "must not be empty with storage.engine=badger")
		}
		switch c.Storage.Badger.Compression {
		case "", "none", "snappy", "zstd":
		default:
			bad("storage.badger.compression", "must be none, snappy or zstd, got %q", c.Storage.Badger.Compression)
		}
		if c.Storage.Badger.BlockCacheSize < 0 {
			bad("storage.badger.block-cache-size", "must not be negative, got %d", c.Storage.Badger.BlockCacheSize)
		}
		if m := c.Storage.Badger.MemTableSize; m != 0 && m < 1<<20 {
			bad("storage.badger.memtable-size", "must be 0 (engine default) or at least 1 MiB, got %d", m)
		}
		if c.Storage.Badger.NumMemtables < 0 {
			bad("storage.badger.num-memtables", "must not be negative, got %d", c.Storage.Badger.NumMemtables)
		}
	case EngineMemKV:
	case EngineWasm:
		if strings.TrimSpace(c.Storage.Wasm.File) == "" {
			bad("storage.wasm.file", "must name a .wasm file with storage.engine=wasm")
		}
		if c.Storage.Wasm.CacheDir == "" && strings.TrimSpace(c.DataDir) == "" {
			bad("storage.wasm.cache-dir", "is empty and so is data-dir, so there is nowhere to keep compiled plugins")
		}
		if d := c.Storage.Wasm.SHA256; d != "" {
			if _, err := host.ParseDigest(d); err != nil {
				bad("storage.wasm.sha256", "%v", err)
			}
		}
	case EngineTiKV:
		if len(c.Storage.TiKV.PDEndpoints) == 0 {
			bad("storage.tikv.pd-endpoints", "at least one PD address is required with storage.engine=tikv")
		}
		if c.Storage.TiKV.Prefix == "" {
			bad("storage.tikv.prefix", "must not be empty with storage.engine=tikv (it namespaces Engram's keys in TiKV)")
		}
	default:
		bad("storage.engine", "unknown engine %q (want %s, %s, %s or %s)", c.Storage.Engine, EngineBadger, EngineMemKV, EngineWasm, EngineTiKV)
	}
	c.validateTiKV(bad)
	if c.Storage.Wasm.PoolSize <= 0 {
		bad("storage.wasm.pool-size", "must be positive, got %d", c.Storage.Wasm.PoolSize)
	}
	if m := c.Storage.Wasm.MemoryLimit; m < 1<<20 || m > 4<<30 {
		bad("storage.wasm.memory-limit", "must be between 1 MiB and 4 GiB (a wasm32 memory), got %d", m)
	}
	if c.Storage.Wasm.CallTimeout <= 0 {
		bad("storage.wasm.call-timeout", "must be positive, got %s", c.Storage.Wasm.CallTimeout)
	}
	for _, a := range c.Storage.Wasm.AllowedAddresses {
		if err := checkHostPort(a); err != nil {
			bad("storage.wasm.allowed-addresses", "%q: %v", a, err)
		}
	}

	if c.HTTP.Listen != "" {
		if err := checkHostPort(c.HTTP.Listen); err != nil {
			bad("http.listen", "%v", err)
		}
	}

	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", "unknown level %q (want debug, info, warn or error)", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		bad("log.format", "unknown format %q (want text or json)", c.Log.Format)
	}

	if c.Watch.ProgressNotifyInterval <= 0 {
		bad("watch.progress-notify-interval", "must be positive, got %s", c.Watch.ProgressNotifyInterval)
	}

	switch c.Compaction.Mode {
	case "":
	case "periodic":
		if c.Compaction.Retention <= 0 {
			bad("compaction.retention", "must be positive with compaction.mode=periodic, got %s", c.Compaction.Retention)
		}
	case "revision":
		if c.Compaction.Revisions <= 0 {
			bad("compaction.revisions", "must be positive with compaction.mode=revision, got %d", c.Compaction.Revisions)
		}
	default:
		bad("compaction.mode", "unknown mode %q (want \"\", periodic or revision)", c.Compaction.Mode)
	}
	if c.Cluster.Enabled {
		if c.Cluster.LeaseDuration <= 0 {
			bad("cluster.lease-duration", "must be positive, got %s", c.Cluster.LeaseDuration)
		} else if c.Cluster.RenewInterval <= 0 || 2*c.Cluster.RenewInterval > c.Cluster.LeaseDuration {
			bad("cluster.renew-interval", "must be positive and at most half of cluster.lease-duration (%s), got %s", c.Cluster.LeaseDuration, c.Cluster.RenewInterval)
		}
		if c.Storage.Engine == EngineBadger || c.Storage.Engine == EngineMemKV {
			bad("cluster.enabled", "storage.engine %s cannot be shared between nodes; a cluster needs a shared store (tikv or a wasm plugin for a remote database)", c.Storage.Engine)
		}
	}
	if (c.Cluster.TLS.CertFile == "") != (c.Cluster.TLS.KeyFile == "") {
		bad("cluster.tls.cert-file", "cluster.tls.cert-file and cluster.tls.key-file go together")
	}
	if c.Compaction.Retention < 0 {
		bad("compaction.retention", "must not be negative, got %s", c.Compaction.Retention)
	}
	if c.Compaction.Revisions < 0 {
		bad("compaction.revisions", "must not be negative, got %d", c.Compaction.Revisions)
	}
	if c.Compaction.Interval < 0 {
		bad("compaction.interval", "must not be negative, got %s", c.Compaction.Interval)
	}

	if c.Limits.MaxRequestBytes <= 0 {
		bad("limits.max-request-bytes", "must be positive, got %d", c.Limits.MaxRequestBytes)
	}
	if c.Limits.MaxTxnOps <= 0 {
		bad("limits.max-txn-ops", "must be positive, got %d", c.Limits.MaxTxnOps)
	}
	if c.ShutdownTimeout <= 0 {
		bad("shutdown-timeout", "must be positive, got %s", c.ShutdownTimeout)
	}
	if c.MemoryLimit > 0 && c.MemoryLimit < 64<<20 {
		// 0 would make the collector run without pause.
		bad("memory-limit", "must be 0 (automatic), at least 64 MiB, or negative (no limit), got %d", c.MemoryLimit)
	}
	return errors.Join(errs...)
}

// validateTiKV checks storage.tikv.* whatever the engine, like the other
// engines' sections: a wrong value fails now, not when the engine is
// switched.
func (c *Config) validateTiKV(bad func(key, format string, args ...any)) {
	t := c.Storage.TiKV
	for _, ep := range t.PDEndpoints {
		hostport := ep
		if u, err := url.Parse(ep); err == nil && (u.Scheme == "http" || u.Scheme == "https") {
			hostport = u.Host
		}
		if err := checkHostPort(hostport); err != nil {
			bad("storage.tikv.pd-endpoints", "%q: %v", ep, err)
		}
	}
	if t.Prefix != "" && strings.Count(t.Prefix, "\xff") == len(t.Prefix) {
		bad("storage.tikv.prefix", "a prefix of only 0xFF bytes has no end; use another")
	}
	if (t.TLS.CertFile == "") != (t.TLS.KeyFile == "") {
		bad("storage.tikv.tls.cert-file", "storage.tikv.tls.cert-file and storage.tikv.tls.key-file go together")
	}
	if t.TLS.CertFile != "" && t.TLS.CAFile == "" {
		bad("storage.tikv.tls.ca-file", "a client certificate needs the cluster's CA (storage.tikv.tls.ca-file) too")
	}
	if t.DialTimeout <= 0 {
		bad("storage.tikv.dial-timeout", "must be positive, got %s", t.DialTimeout)
	}
	if t.RequestTimeout <= 0 {
		bad("storage.tikv.request-timeout", "must be positive, got %s", t.RequestTimeout)
	}
	if t.GCInterval < 0 {
		bad("storage.tikv.gc-interval", "must not be negative, got %s (0 disables GC)", t.GCInterval)
	}
	if t.GCLifeTime < time.Minute {
		bad("storage.tikv.gc-life-time", "must be at least 1m, got %s", t.GCLifeTime)
	}
}

// ClientURL is a parsed listen or advertise URL.
type ClientURL struct {
	// Scheme is "http", "https" or "unix".
	Scheme string
	// Address is host:port for http and https, the socket path for unix.
	Address string
}

// ParseClientURL parses an entry of listen-client-urls or
// advertise-client-urls. Unix socket URLs follow the etcd client's reading:
// unix:///abs/path and unix:/abs/path are absolute, unix://rel/path and
// unix:rel/path relative to the working directory.
func ParseClientURL(raw string) (ClientURL, error) {
	if rest, ok := strings.CutPrefix(raw, "unix:"); ok {
		path := strings.TrimPrefix(rest, "//")
		if path == "" {
			return ClientURL{}, fmt.Errorf("%q: unix socket URL has no path (want unix:///abs/path or unix:rel/path)", raw)
		}
		return ClientURL{Scheme: "unix", Address: path}, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return ClientURL{}, fmt.Errorf("%q: %w", raw, err)
	}
	switch u.Scheme {
	case "http", "https":
	default:
		return ClientURL{}, fmt.Errorf("%q: unsupported scheme %q (want http, https or unix)", raw, u.Scheme)
	}
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return ClientURL{}, fmt.Errorf("%q: a client URL is scheme://host:port with nothing after the port", raw)
	}
	if err := checkHostPort(u.Host); err != nil {
		return ClientURL{}, fmt.Errorf("%q: %w", raw, err)
	}
	return ClientURL{Scheme: u.Scheme, Address: u.Host}, nil
}

func checkHostPort(hostport string) error {
	_, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return fmt.Errorf("want host:port: %w", err)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("invalid port %q in %q", port, hostport)
	}
	return nil
}
