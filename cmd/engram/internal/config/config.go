// Package config defines, loads and validates the configuration of the engram
// server binary.
//
// It owns the one authoritative list of settings: the Config struct below
// (its storage sections in storage.go).
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
//
// Where things are: config.go and storage.go hold the settings,
// defaults.go the first layer, load.go the other layers and --help,
// validate.go the rules (one step per section), clienturl.go the form of
// listen and advertise URLs.
package config

import "time"

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

	// DataDir holds the storage engine's files; the badger and pebble
	// engines keep them in DataDir/badger and DataDir/pebble. Unused by
	// memkv.
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

	// Auth configures etcd's user/role authentication, which is off until
	// a client runs `etcdctl auth enable`.
	Auth Auth `koanf:"auth"`

	// QuotaBackendBytes raises etcd's NOSPACE alarm once the storage
	// engine reports more bytes than this (etcd: --quota-backend-bytes).
	// While the alarm is on, requests that add data are refused and reads,
	// deletes and compactions still run; `etcdctl alarm disarm` clears it
	// once space is back. 0 sets no quota: unlike etcd's bbolt file, most
	// engines (TiKV, a database behind a plugin) manage their own space.
	QuotaBackendBytes int64 `koanf:"quota-backend-bytes" help:"raise the NOSPACE alarm and refuse writes above this many stored bytes (0 = no quota)"`

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

	// unknownEnv names the ENGRAM_* variables of the environment that are
	// no key, sorted (env.go). It has no koanf tag, so it is no key itself.
	unknownEnv []string
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

// Auth configures authentication with users and roles (etcd's auth). The
// users, roles and the enabled flag live in the store, so every member of
// a cluster shares them; these keys only say how tokens are made.
type Auth struct {
	// Token is etcd's --auth-token: "simple" (random tokens kept by the
	// member that issued them, for TokenTTL after their last use), or
	// "jwt,pub-key=FILE,priv-key=FILE,sign-method=RS256[,ttl=5m]" (signed
	// tokens any member can check; use it for clusters).
	Token string `koanf:"token" help:"token type: simple, or jwt,pub-key=FILE,priv-key=FILE,sign-method=ALG[,ttl=DURATION] (etcd's --auth-token)"`
	// TokenTTL is how long a simple token lives after its last use (etcd:
	// --auth-token-ttl, 300s).
	TokenTTL time.Duration `koanf:"token-ttl" help:"lifetime of a simple token after its last use"`
	// BcryptCost is the cost of hashing passwords (etcd: --bcrypt-cost).
	BcryptCost int `koanf:"bcrypt-cost" help:"bcrypt cost of password hashes (4 to 31)"`
}

// Limits bound requests, as etcd's flags of the same names do.
type Limits struct {
	// MaxRequestBytes bounds one gRPC request (etcd: --max-request-bytes).
	MaxRequestBytes int `koanf:"max-request-bytes" help:"largest accepted request in bytes"`
	// MaxTxnOps bounds the operations of one Txn (etcd: --max-txn-ops).
	MaxTxnOps int `koanf:"max-txn-ops" help:"most operations in one transaction"`
}
