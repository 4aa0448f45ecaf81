package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/engramkv/engram/cmd/engram/internal/config"
	"github.com/engramkv/engram/core/kv"
	badgerkv "github.com/engramkv/engram/plugins/badger"
	"github.com/engramkv/engram/plugins/memkv"
)

// openStore opens the engine named by storage.engine. The caller closes it
// after the server has shut down.
func openStore(cfg config.Config, logger *slog.Logger) (kv.Store, error) {
	switch cfg.Storage.Engine {
	case config.EngineBadger:
		opts := badgerkv.Options{
			InMemory:       cfg.Storage.Badger.InMemory,
			Logger:         logger,
			GCInterval:     cfg.Storage.Badger.GCInterval,
			BlockCacheSize: cfg.Storage.Badger.BlockCacheSize,
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
	case config.EngineMemKV:
		logger.Warn("storage.engine is memkv: all data is lost when the process exits")
		return memkv.New(), nil
	default:
		// config.Validate refuses other names; this guards a new engine
		// name added there but not here.
		return nil, fmt.Errorf("storage.engine: unknown engine %q", cfg.Storage.Engine)
	}
}
