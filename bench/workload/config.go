// Package workload is the load generator behind `engram bench`: it drives any
// etcd v3 endpoint with requests shaped like kube-apiserver's (listed in
// bench/README.md, "kube-apiserver's requests") and measures throughput and
// latency.
//
// It owns the workloads (create, get, update, list, delete, mixed, watch,
// the load used for memory measurements, and two that are not part of
// "all": churn, updates under kube-apiserver's compactor, and
// small-cluster, a small cluster's objects through their life), key and
// value generation,
// preloading, pacing, latency recording and the progress display. It must
// not start servers, know which store it talks to, or keep state between
// runs: the caller passes everything in a Config and gets a result.Report.
package workload

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// Workload names, in the order Run executes "all".
const (
	Create = "create"
	Get    = "get"
	Update = "update"
	List   = "list"
	Delete = "delete"
	Mixed  = "mixed"
	Watch  = "watch"
	// Load creates exactly DataSet objects and leaves them in place, so the
	// server's memory can be measured afterwards. It is not part of "all".
	Load = "load"
)

// All is the set "all" stands for.
var All = []string{Create, Get, Update, List, Delete, Mixed, Watch}

// Config is everything one run needs. Zero fields take the defaults of
// Defaults().
type Config struct {
	Endpoints []string
	// TLS is used to dial when non-nil.
	TLS         *tls.Config
	DialTimeout time.Duration

	// Clients is the number of concurrent request loops (kube-apiserver's
	// concurrency); they share Connections gRPC connections round-robin.
	Clients     int
	Connections int
	KeySize     int
	ValueSize   int
	// KeyOrder is the order in which key names are made: KeyOrderRandom
	// (the default) or KeyOrderSequential.
	KeyOrder string
	// DataSet is the number of keys preloaded for get, update, list and
	// mixed, and created by load.
	DataSet int
	// DeleteKeys is the number of keys preloaded for delete; the delete
	// workload ends early when a client has deleted its share.
	DeleteKeys int
	Duration   time.Duration
	// Rate caps operations per second over all clients; 0 is unlimited.
	Rate float64
	// Prefix is put before every key. Empty: a unique /bench/<random>/ per
	// run, so runs against the same server never see each other's keys.
	Prefix string

	// ListLimit is the page size of the list workload, and ListClients its
	// concurrency (a full list holds DataSet values in flight, so fewer
	// loops than Clients, as kube-apiserver runs few full lists at once).
	ListLimit   int
	ListClients int
	// ReadRatio is the share of gets in the mixed workload; the rest are
	// updates.
	ReadRatio float64
	// Watchers is the number of watches on the watch workload's prefix and
	// WatchRate the writes per second made while they are open (events per
	// second delivered = WatchRate x Watchers).
	Watchers  int
	WatchRate float64
	// WatchDrain bounds the wait for outstanding events after the last
	// write.
	WatchDrain time.Duration

	// LoadBatch is the number of objects each transaction of the load
	// workload creates (1: one create per object, as kube-apiserver).
	LoadBatch int
	// CompactEvery is the churn workload's compaction interval
	// (kube-apiserver's --etcd-compaction-interval); 0 never compacts.
	CompactEvery time.Duration
	// LoadFrom is the index of the first object load creates (objects
	// LoadFrom..DataSet-1), so a store can be grown in steps; PrefixObjects
	// spreads the objects over sub-prefixes of that many each; Existing
	// makes get and list read the objects load created under Prefix (all
	// DataSet of them; list: the first sub-prefix) instead of preloading
	// their own. See existing.go.
	LoadFrom      int
	PrefixObjects int
	Existing      bool
	// ClusterPods and ClusterNodes size the small-cluster workload
	// (smallcluster.go).
	ClusterPods  int
	ClusterNodes int

	// Cleanup deletes each workload's keys after it and compacts, as
	// kube-apiserver's compactor would, so workloads do not weigh on each
	// other.
	Cleanup bool

	// Progress receives a live progress line; nil shows none.
	Progress io.Writer
	Logger   *slog.Logger
	// Tool is recorded in the report, e.g. "engram bench v1.2.3".
	Tool string
}

// Defaults returns the settings of `engram bench` without flags: the shape
// of kube-apiserver's traffic (70-byte keys, 512-byte values, 300 clients over
// 10 connections).
func Defaults() Config {
	return Config{
		Endpoints:   []string{"127.0.0.1:2379"},
		DialTimeout: 5 * time.Second,
		Clients:     300,
		Connections: 10,
		KeySize:     70,
		ValueSize:   512,
		KeyOrder:    KeyOrderRandom,
		DataSet:     10_000,
		DeleteKeys:  100_000,
		Duration:    10 * time.Second,
		ListLimit:   500,
		ListClients: 10,
		ReadRatio:   0.9,
		Watchers:    100,
		WatchRate:   200,
		WatchDrain:  10 * time.Second,
		LoadBatch:   1,
		Cleanup:     true,

		ClusterPods:  5000,
		ClusterNodes: 500,

		// kube-apiserver's --etcd-compaction-interval default.
		CompactEvery: 5 * time.Minute,
	}
}

// ParseWorkloads turns a comma-separated list ("all" allowed) into workload
// names, rejecting unknown ones.
func ParseWorkloads(s string) ([]string, error) {
	var out []string
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		switch {
		case name == "":
		case name == "all":
			out = append(out, All...)
		case slices.Contains(All, name) || name == Load || name == Churn || name == SmallCluster:
			out = append(out, name)
		default:
			return nil, fmt.Errorf("unknown workload %q (want %s, %s, %s, %s or all)", name, strings.Join(All, ", "), Load, Churn, SmallCluster)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no workload given")
	}
	return out, nil
}

func (c *Config) validate() error {
	switch {
	case len(c.Endpoints) == 0:
		return fmt.Errorf("no endpoints")
	case c.Clients < 1 || c.Connections < 1 || c.ListClients < 1:
		return fmt.Errorf("clients, connections and list clients must be at least 1")
	case c.ValueSize < 8:
		// The watch workload stamps the send time into the value.
		return fmt.Errorf("value size must be at least 8 bytes")
	case c.DataSet < 1 || c.DeleteKeys < 1:
		return fmt.Errorf("data set and delete keys must be at least 1")
	case c.Duration <= 0:
		return fmt.Errorf("duration must be positive")
	case c.ListLimit < 1:
		return fmt.Errorf("list limit must be at least 1")
	case c.ReadRatio < 0 || c.ReadRatio > 1:
		return fmt.Errorf("read ratio must be within 0..1")
	case c.Watchers < 1 || c.WatchRate <= 0:
		return fmt.Errorf("watchers and watch rate must be positive")
	case c.Rate < 0:
		return fmt.Errorf("rate must not be negative")
	case c.LoadBatch < 1 || c.LoadBatch > 128:
		// 128 is etcd's default --max-txn-ops.
		return fmt.Errorf("load batch must be within 1..128")
	case c.ClusterPods < 1 || c.ClusterNodes < 1:
		return fmt.Errorf("cluster pods and nodes must be at least 1")
	case c.KeyOrder != KeyOrderRandom && c.KeyOrder != KeyOrderSequential:
		return fmt.Errorf("key order must be %q or %q, got %q", KeyOrderRandom, KeyOrderSequential, c.KeyOrder)
	}
	if err := c.validateExisting(); err != nil {
		return err
	}
	if c.Prefix == "" {
		var b [6]byte
		if _, err := rand.Read(b[:]); err != nil {
			return fmt.Errorf("random prefix: %w", err)
		}
		c.Prefix = "/bench/" + hex.EncodeToString(b[:]) + "/"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Key orders.
const (
	// KeyOrderRandom names the i-th key of a workload by a bijective scramble
	// of i, so keys created one after another land anywhere in the key
	// space, as kube-apiserver's object names (pod names with random
	// suffixes, UIDs) do. This is the default: sequential names make
	// every write an append at the end of an ordered engine's key space,
	// which flatters B-trees and LSM trees alike.
	KeyOrderRandom = "random"
	// KeyOrderSequential names the i-th key by i itself, zero-padded, so
	// keys sort in creation order.
	KeyOrderSequential = "sequential"
)

// keyspace makes the keys of one workload: prefix + workload + "/" + a
// name for the key's index filling the key to KeySize bytes: the index
// zero-padded (sequential), or a 64-bit scramble of it in hexadecimal
// (random). Either way distinct indexes give distinct keys of the same size,
// under one prefix.
type keyspace struct {
	base   string
	width  int
	random bool
}

func newKeyspace(prefix, workload string, keySize int, order string) keyspace {
	base := prefix + workload + "/"
	width := keySize - len(base)
	if width < 1 {
		// The prefix alone is longer than KeySize: keys get longer than
		// asked rather than colliding.
		width = 1
	}
	return keyspace{base: base, width: width, random: order != KeyOrderSequential}
}

func (k keyspace) key(i int) string {
	if k.random {
		// 16 hex digits hold any scramble; a narrower width makes the key
		// longer than asked rather than truncating it into a collision.
		return fmt.Sprintf("%s%0*x", k.base, k.width, scramble(uint64(i)))
	}
	return fmt.Sprintf("%s%0*d", k.base, k.width, i)
}

// scramble is a bijection on 64-bit integers (the finalizer of SplitMix64:
// each xor-shift and each multiplication by an odd constant is invertible),
// so it maps distinct indexes to distinct, evenly spread names.
func scramble(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// prefixEnd is the range end of every key starting with k.base.
func (k keyspace) end() string {
	b := []byte(k.base)
	// base ends with "/", never 0xff: incrementing the last byte suffices.
	b[len(b)-1]++
	return string(b)
}
