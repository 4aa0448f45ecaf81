package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/engramkv/engram/wasm/host"
)

// problems collects the violations Validate finds, each prefixed with the key
// it is about, so one run reports all of them.
type problems []error

func (p *problems) add(key, format string, args ...any) {
	*p = append(*p, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
}

// Validate checks every rule that does not need the filesystem or network
// and returns all violations at once, each naming its key. Each step checks
// one section of the configuration and the rules that tie it to others.
func (c *Config) Validate() error {
	var p problems
	c.validateName(&p)
	c.validateTLS(&p)
	c.validateClientURLs(&p)
	c.validateStorage(&p)
	c.validateHTTP(&p)
	c.validateLog(&p)
	c.validateWatch(&p)
	c.validateCompaction(&p)
	c.validateCluster(&p)
	c.validateLimits(&p)
	c.validateProcess(&p)
	return errors.Join(p...)
}

func (c *Config) validateName(p *problems) {
	if strings.TrimSpace(c.Name) == "" {
		p.add("name", "must not be empty")
	}
}

// tlsOn reports whether https:// listeners have a certificate.
func (c *Config) tlsOn() bool { return c.TLS.CertFile != "" || c.TLS.KeyFile != "" }

// validateTLS checks tls.*: the server certificate and key come as a pair,
// and client certificate authentication needs them.
func (c *Config) validateTLS(p *problems) {
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		p.add("tls.cert-file", "tls.cert-file and tls.key-file must be set together")
	}
	if c.TLS.ClientCAFile != "" && !c.tlsOn() {
		p.add("tls.client-ca-file", "client certificate authentication needs tls.cert-file and tls.key-file")
	}
}

// validateClientURLs checks listen-client-urls and advertise-client-urls,
// and that the listeners agree with tls.*: https:// needs a certificate, a
// certificate needs an https:// listener, and client certificate
// authentication allows no plaintext TCP listener to bypass it.
func (c *Config) validateClientURLs(p *problems) {
	if len(c.ListenClientURLs) == 0 {
		p.add("listen-client-urls", "at least one URL is required")
	}
	anyHTTPS := false
	for _, raw := range c.ListenClientURLs {
		u, err := ParseClientURL(raw)
		if err != nil {
			p.add("listen-client-urls", "%v", err)
			continue
		}
		switch u.Scheme {
		case "https":
			anyHTTPS = true
			if !c.tlsOn() {
				p.add("listen-client-urls", "%s needs tls.cert-file and tls.key-file", raw)
			}
		case "http":
			if c.TLS.ClientCAFile != "" {
				p.add("listen-client-urls", "%s is plaintext, which would bypass the client certificate authentication tls.client-ca-file asks for; use https://", raw)
			}
		}
	}
	if c.tlsOn() && !anyHTTPS && len(c.ListenClientURLs) > 0 {
		p.add("tls.cert-file", "is set but no listen-client-urls entry uses https://")
	}
	for _, raw := range c.AdvertiseClientURLs {
		if _, err := ParseClientURL(raw); err != nil {
			p.add("advertise-client-urls", "%v", err)
		}
	}
}

// validateStorage checks storage.engine and what the chosen engine requires,
// then the tikv and wasm sections whatever the engine.
func (c *Config) validateStorage(p *problems) {
	switch c.Storage.Engine {
	case EngineBadger:
		c.validateBadger(p)
	case EnginePebble:
		c.validatePebble(p)
	case EngineMemKV:
	case EngineWasm:
		c.validateWasmEngine(p)
	case EngineTiKV:
		if len(c.Storage.TiKV.PDEndpoints) == 0 {
			p.add("storage.tikv.pd-endpoints", "at least one PD address is required with storage.engine=tikv")
		}
		if c.Storage.TiKV.Prefix == "" {
			p.add("storage.tikv.prefix", "must not be empty with storage.engine=tikv (it namespaces Engram's keys in TiKV)")
		}
	default:
		p.add("storage.engine", "unknown engine %q (want %s, %s, %s, %s or %s)", c.Storage.Engine, EngineBadger, EnginePebble, EngineMemKV, EngineWasm, EngineTiKV)
	}
	c.validateTiKV(p)
	c.validateWasm(p)
}

// validateBadger checks storage.badger.* and data-dir; only when badger is
// the engine.
func (c *Config) validateBadger(p *problems) {
	b := c.Storage.Badger
	if !b.InMemory && strings.TrimSpace(c.DataDir) == "" {
		p.add("data-dir", "must not be empty with storage.engine=badger")
	}
	switch b.Compression {
	case "", "none", "snappy", "zstd":
	default:
		p.add("storage.badger.compression", "must be none, snappy or zstd, got %q", b.Compression)
	}
	if b.BlockCacheSize < 0 {
		p.add("storage.badger.block-cache-size", "must not be negative, got %d", b.BlockCacheSize)
	}
	if m := b.MemTableSize; m != 0 && m < 1<<20 {
		p.add("storage.badger.memtable-size", "must be 0 (engine default) or at least 1 MiB, got %d", m)
	}
	if b.NumMemtables < 0 {
		p.add("storage.badger.num-memtables", "must not be negative, got %d", b.NumMemtables)
	}
}

// validatePebble checks storage.pebble.* and data-dir; only when pebble is
// the engine.
func (c *Config) validatePebble(p *problems) {
	pb := c.Storage.Pebble
	if strings.TrimSpace(c.DataDir) == "" {
		p.add("data-dir", "must not be empty with storage.engine=pebble")
	}
	if pb.CacheSize < 1<<20 {
		p.add("storage.pebble.cache-size", "must be at least 1 MiB, got %d", pb.CacheSize)
	}
	if pb.MemTableSize < 1<<20 {
		p.add("storage.pebble.memtable-size", "must be at least 1 MiB, got %d", pb.MemTableSize)
	}
	switch pb.Compression {
	case "", "none", "snappy", "zstd":
	default:
		p.add("storage.pebble.compression", "must be none, snappy or zstd, got %q", pb.Compression)
	}
}

// validateWasmEngine checks what storage.engine=wasm needs: a plugin file,
// a place for its compiled code and, if pinned, a well-formed digest.
func (c *Config) validateWasmEngine(p *problems) {
	w := c.Storage.Wasm
	if strings.TrimSpace(w.File) == "" {
		p.add("storage.wasm.file", "must name a .wasm file with storage.engine=wasm")
	}
	if w.CacheDir == "" && strings.TrimSpace(c.DataDir) == "" {
		p.add("storage.wasm.cache-dir", "is empty and so is data-dir, so there is nowhere to keep compiled plugins")
	}
	if d := w.SHA256; d != "" {
		if _, err := host.ParseDigest(d); err != nil {
			p.add("storage.wasm.sha256", "%v", err)
		}
	}
}

// validateWasm checks the limits of storage.wasm.* whatever the engine, as
// validateTiKV does.
func (c *Config) validateWasm(p *problems) {
	w := c.Storage.Wasm
	if w.PoolSize <= 0 {
		p.add("storage.wasm.pool-size", "must be positive, got %d", w.PoolSize)
	}
	if m := w.MemoryLimit; m < 1<<20 || m > 4<<30 {
		p.add("storage.wasm.memory-limit", "must be between 1 MiB and 4 GiB (a wasm32 memory), got %d", m)
	}
	if w.CallTimeout <= 0 {
		p.add("storage.wasm.call-timeout", "must be positive, got %s", w.CallTimeout)
	}
	for _, a := range w.AllowedAddresses {
		if err := checkHostPort(a); err != nil {
			p.add("storage.wasm.allowed-addresses", "%q: %v", a, err)
		}
	}
}

// validateTiKV checks storage.tikv.* whatever the engine, like the other
// engines' sections: a wrong value fails now, not when the engine is
// switched.
func (c *Config) validateTiKV(p *problems) {
	t := c.Storage.TiKV
	for _, ep := range t.PDEndpoints {
		hostport := ep
		if u, err := url.Parse(ep); err == nil && (u.Scheme == "http" || u.Scheme == "https") {
			hostport = u.Host
		}
		if err := checkHostPort(hostport); err != nil {
			p.add("storage.tikv.pd-endpoints", "%q: %v", ep, err)
		}
	}
	if t.Prefix != "" && strings.Count(t.Prefix, "\xff") == len(t.Prefix) {
		p.add("storage.tikv.prefix", "a prefix of only 0xFF bytes has no end; use another")
	}
	if (t.TLS.CertFile == "") != (t.TLS.KeyFile == "") {
		p.add("storage.tikv.tls.cert-file", "storage.tikv.tls.cert-file and storage.tikv.tls.key-file go together")
	}
	if t.TLS.CertFile != "" && t.TLS.CAFile == "" {
		p.add("storage.tikv.tls.ca-file", "a client certificate needs the cluster's CA (storage.tikv.tls.ca-file) too")
	}
	if t.DialTimeout <= 0 {
		p.add("storage.tikv.dial-timeout", "must be positive, got %s", t.DialTimeout)
	}
	if t.RequestTimeout <= 0 {
		p.add("storage.tikv.request-timeout", "must be positive, got %s", t.RequestTimeout)
	}
	if t.GCInterval < 0 {
		p.add("storage.tikv.gc-interval", "must not be negative, got %s (0 disables GC)", t.GCInterval)
	}
	if t.GCLifeTime < time.Minute {
		p.add("storage.tikv.gc-life-time", "must be at least 1m, got %s", t.GCLifeTime)
	}
}

func (c *Config) validateHTTP(p *problems) {
	if c.HTTP.Listen != "" {
		if err := checkHostPort(c.HTTP.Listen); err != nil {
			p.add("http.listen", "%v", err)
		}
	}
}

func (c *Config) validateLog(p *problems) {
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		p.add("log.level", "unknown level %q (want debug, info, warn or error)", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		p.add("log.format", "unknown format %q (want text or json)", c.Log.Format)
	}
}

func (c *Config) validateWatch(p *problems) {
	if c.Watch.ProgressNotifyInterval <= 0 {
		p.add("watch.progress-notify-interval", "must be positive, got %s", c.Watch.ProgressNotifyInterval)
	}
}

// validateCompaction checks compaction.*: the mode and the amount of
// history it keeps, and that no duration or count is negative whatever the
// mode.
func (c *Config) validateCompaction(p *problems) {
	cp := c.Compaction
	switch cp.Mode {
	case "":
	case "periodic":
		if cp.Retention <= 0 {
			p.add("compaction.retention", "must be positive with compaction.mode=periodic, got %s", cp.Retention)
		}
	case "revision":
		if cp.Revisions <= 0 {
			p.add("compaction.revisions", "must be positive with compaction.mode=revision, got %d", cp.Revisions)
		}
	default:
		p.add("compaction.mode", "unknown mode %q (want \"\", periodic or revision)", cp.Mode)
	}
	if cp.Retention < 0 {
		p.add("compaction.retention", "must not be negative, got %s", cp.Retention)
	}
	if cp.Revisions < 0 {
		p.add("compaction.revisions", "must not be negative, got %d", cp.Revisions)
	}
	if cp.Interval < 0 {
		p.add("compaction.interval", "must not be negative, got %s", cp.Interval)
	}
}

// validateCluster checks cluster.*: a lease the leader can renew in time,
// a store the nodes can share, and a forwarding certificate with its key.
func (c *Config) validateCluster(p *problems) {
	cl := c.Cluster
	if cl.Enabled {
		if cl.LeaseDuration <= 0 {
			p.add("cluster.lease-duration", "must be positive, got %s", cl.LeaseDuration)
		} else if cl.RenewInterval <= 0 || 2*cl.RenewInterval > cl.LeaseDuration {
			p.add("cluster.renew-interval", "must be positive and at most half of cluster.lease-duration (%s), got %s", cl.LeaseDuration, cl.RenewInterval)
		}
		if c.Storage.Engine == EngineBadger || c.Storage.Engine == EnginePebble || c.Storage.Engine == EngineMemKV {
			p.add("cluster.enabled", "storage.engine %s cannot be shared between nodes; a cluster needs a shared store (tikv or a wasm plugin for a remote database)", c.Storage.Engine)
		}
	}
	if (cl.TLS.CertFile == "") != (cl.TLS.KeyFile == "") {
		p.add("cluster.tls.cert-file", "cluster.tls.cert-file and cluster.tls.key-file go together")
	}
}

func (c *Config) validateLimits(p *problems) {
	if c.Limits.MaxRequestBytes <= 0 {
		p.add("limits.max-request-bytes", "must be positive, got %d", c.Limits.MaxRequestBytes)
	}
	if c.Limits.MaxTxnOps <= 0 {
		p.add("limits.max-txn-ops", "must be positive, got %d", c.Limits.MaxTxnOps)
	}
}

// validateProcess checks the keys about the process as a whole:
// shutdown-timeout and memory-limit.
func (c *Config) validateProcess(p *problems) {
	if c.ShutdownTimeout <= 0 {
		p.add("shutdown-timeout", "must be positive, got %s", c.ShutdownTimeout)
	}
	if c.MemoryLimit > 0 && c.MemoryLimit < 64<<20 {
		// 0 would make the collector run without pause.
		p.add("memory-limit", "must be 0 (automatic), at least 64 MiB, or negative (no limit), got %d", c.MemoryLimit)
	}
}

// checkHostPort checks a host:port with a numeric port; the host may be
// empty (all interfaces) and is not resolved.
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
