package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/engramkv/engram/cmd/engram/internal/config"
)

// TestOpenStoreTiKV checks the storage.tikv.* wiring: every key reaches the
// adaptor, and an unreachable PD fails the start within dial-timeout,
// naming the engine.
func TestOpenStoreTiKV(t *testing.T) {
	cfg := config.Default()
	cfg.Storage.Engine = config.EngineTiKV
	cfg.Storage.TiKV.PDEndpoints = []string{"127.0.0.1:1"}
	cfg.Storage.TiKV.Prefix = "engram/test/"
	cfg.Storage.TiKV.TLS = config.TiKVTLS{CAFile: "ca.pem", CertFile: "c.pem", KeyFile: "k.pem"}
	cfg.Storage.TiKV.DialTimeout = 300 * time.Millisecond
	logger := slog.New(slog.DiscardHandler)

	o := tikvOptions(cfg, logger)
	if strings.Join(o.PDEndpoints, ",") != "127.0.0.1:1" || string(o.Prefix) != "engram/test/" ||
		o.TLS.CAFile != "ca.pem" || o.TLS.CertFile != "c.pem" || o.TLS.KeyFile != "k.pem" ||
		o.DialTimeout != 300*time.Millisecond || o.RequestTimeout != cfg.Storage.TiKV.RequestTimeout ||
		o.GCInterval != cfg.Storage.TiKV.GCInterval || o.GCLifeTime != cfg.Storage.TiKV.GCLifeTime || o.Logger != logger {
		t.Errorf("tikvOptions = %+v does not carry storage.tikv.*", o)
	}

	cfg.Storage.TiKV.TLS = config.TiKVTLS{}
	start := time.Now()
	st, err := openStore(context.Background(), cfg, logger, nil)
	if err == nil {
		_ = st.Close()
		t.Fatal("openStore with an unreachable PD succeeded")
	}
	if !strings.Contains(err.Error(), "storage.engine=tikv") {
		t.Errorf("openStore error %q does not name the engine", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("openStore took %v to give up; dial-timeout is 300ms", d)
	}
}

// TestOpenStorePebble opens storage.engine=pebble in <data-dir>/pebble with
// storage.pebble.*, and a second process's open of the same directory fails
// naming the engine.
func TestOpenStorePebble(t *testing.T) {
	cfg := config.Default()
	cfg.Storage.Engine = config.EnginePebble
	cfg.DataDir = t.TempDir()
	cfg.Storage.Pebble.Compression = "snappy"
	logger := slog.New(slog.DiscardHandler)
	st, err := openStore(context.Background(), cfg, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if f := st.Features(); f.Name != "pebble" || !f.Durable {
		t.Errorf("features %+v, want a durable pebble store", f)
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "pebble", "LOCK")); err != nil {
		t.Errorf("no pebble files in <data-dir>/pebble: %v", err)
	}
	if _, err := openStore(context.Background(), cfg, logger, nil); err == nil || !strings.Contains(err.Error(), "storage.engine=pebble") {
		t.Errorf("second open of the directory: %v, want an error naming the engine", err)
	}
}
