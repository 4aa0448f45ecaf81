package config

import "time"

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
		}, Pebble: Pebble{
			CacheSize:    64 << 20,
			MemTableSize: 16 << 20,
			Compression:  "none",
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
		Limits:  Limits{MaxRequestBytes: 1536 * 1024, MaxTxnOps: 128},
		Cluster: Cluster{LeaseDuration: 5 * time.Second, RenewInterval: 1250 * time.Millisecond},
		// etcd's defaults.
		Auth:            Auth{Token: "simple", TokenTTL: 300 * time.Second, BcryptCost: 10},
		ShutdownTimeout: 5 * time.Second,
		// Automatic (90% of the container's or machine's memory) rather than
		// a fixed size: a fixed limit below the live heap makes the collector
		// run without pause (DESIGN.md, "The Go runtime's memory limit").
		MemoryLimit: 0,
	}
}
