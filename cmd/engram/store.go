package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/engramkv/engram/cmd/engram/internal/config"
	"github.com/engramkv/engram/core/kv"
	badgerkv "github.com/engramkv/engram/engines/badger"
	"github.com/engramkv/engram/engines/memkv"
	pebblekv "github.com/engramkv/engram/engines/pebble"
	"github.com/engramkv/engram/engines/tikv"
	"github.com/engramkv/engram/wasm/host"
)

// openStore opens the engine named by storage.engine. The caller closes it
// after the server has shut down. reg receives engine metrics (may be nil).
func openStore(ctx context.Context, cfg config.Config, logger *slog.Logger, reg prometheus.Registerer) (kv.Store, error) {
	switch cfg.Storage.Engine {
	case config.EngineWasm:
		st, err := openWasm(ctx, cfg, logger, reg)
		if err != nil {
			return nil, fmt.Errorf("storage.engine=wasm: %w", err)
		}
		return st, nil
	case config.EngineBadger:
		opts := badgerkv.Options{
			InMemory:       cfg.Storage.Badger.InMemory,
			Logger:         logger,
			GCInterval:     cfg.Storage.Badger.GCInterval,
			Compression:    cfg.Storage.Badger.Compression,
			BlockCacheSize: cfg.Storage.Badger.BlockCacheSize,
			MemTableSize:   cfg.Storage.Badger.MemTableSize,
			NumMemtables:   cfg.Storage.Badger.NumMemtables,
		}
		if !opts.InMemory {
			// A subdirectory per engine leaves room beside it for files
			// that are not the engine's (and for switching engines
			// without mixing their files).
			opts.Dir = filepath.Join(cfg.DataDir, "badger")
			if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
				return nil, fmt.Errorf("data-dir: %w", err)
			}
		}
		st, err := badgerkv.Open(opts)
		if err != nil {
			return nil, fmt.Errorf("storage.engine=badger: %w", err)
		}
		return st, nil
	case config.EnginePebble:
		dir := filepath.Join(cfg.DataDir, "pebble")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("data-dir: %w", err)
		}
		st, err := pebblekv.Open(pebblekv.Options{
			Dir:          dir,
			Logger:       logger,
			CacheSize:    cfg.Storage.Pebble.CacheSize,
			MemTableSize: cfg.Storage.Pebble.MemTableSize,
			Compression:  cfg.Storage.Pebble.Compression,
		})
		if err != nil {
			return nil, fmt.Errorf("storage.engine=pebble: %w", err)
		}
		return st, nil
	case config.EngineMemKV:
		logger.Warn("storage.engine is memkv: all data is lost when the process exits")
		return memkv.New(), nil
	case config.EngineTiKV:
		st, err := tikv.Open(ctx, tikvOptions(cfg, logger))
		if err != nil {
			return nil, fmt.Errorf("storage.engine=tikv: %w", err)
		}
		return st, nil
	default:
		// config.Validate refuses other names; this guards a new engine
		// name added there but not here.
		return nil, fmt.Errorf("storage.engine: unknown engine %q", cfg.Storage.Engine)
	}
}

// wasmOptions maps storage.wasm.* to the host's options.
func wasmOptions(cfg config.Config, logger *slog.Logger, reg prometheus.Registerer) (host.Options, host.StoreOptions) {
	w := cfg.Storage.Wasm
	cacheDir := w.CacheDir
	if cacheDir == "" {
		cacheDir = filepath.Join(cfg.DataDir, "wasm-cache")
	}
	return host.Options{
			Logger:      logger,
			Registerer:  reg,
			CacheDir:    cacheDir,
			MemoryLimit: w.MemoryLimit,
			Untrusted:   w.Untrusted,
			SHA256:      w.SHA256,
		}, host.StoreOptions{
			Config:           []byte(w.Config),
			PoolSize:         w.PoolSize,
			AllowedAddresses: w.AllowedAddresses,
			CallTimeout:      w.CallTimeout,
		}
}

// openWasm loads storage.wasm.file (compiling it, or loading it from the
// cache) and starts its instances; a malformed or wrong-version file fails
// here, before the server starts.
func openWasm(ctx context.Context, cfg config.Config, logger *slog.Logger, reg prometheus.Registerer) (kv.Store, error) {
	opts, sopts := wasmOptions(cfg, logger, reg)
	return host.OpenFile(ctx, cfg.Storage.Wasm.File, opts, sopts)
}

// tikvOptions maps storage.tikv.* to the TiKV adaptor's options.
func tikvOptions(cfg config.Config, logger *slog.Logger) tikv.Options {
	t := cfg.Storage.TiKV
	return tikv.Options{
		PDEndpoints: t.PDEndpoints,
		Prefix:      []byte(t.Prefix),
		TLS: tikv.TLSOptions{
			CAFile:   t.TLS.CAFile,
			CertFile: t.TLS.CertFile,
			KeyFile:  t.TLS.KeyFile,
		},
		Logger:         logger,
		DialTimeout:    t.DialTimeout,
		RequestTimeout: t.RequestTimeout,
		GCInterval:     t.GCInterval,
		GCLifeTime:     t.GCLifeTime,
	}
}
