package sqlkv

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/engramkv/engram/wasm/sdk"
)

// Serve is an adaptor's main: it gives the Go runtime its soft memory
// limit (GCMemoryLimit) and serves s.
func Serve(s sdk.Store) {
	debug.SetMemoryLimit(GCMemoryLimit)
	sdk.Serve(s)
}

// Manifest is a SQL adaptor's answer to INIT: its instances are
// interchangeable clients of the database (pooled), and the database makes
// every commit durable.
func Manifest(name, version string) sdk.Manifest {
	return sdk.Manifest{Name: name, Version: version, Model: sdk.ModelPooled, Durable: true}
}

// Configure is what an adaptor's Init checks first: it parses the
// operator's configuration raw with parse, then refuses a host that allows
// no network address, where an adaptor could reach no database, with the
// setting that fixes it.
func Configure[C any](raw []byte, host sdk.HostInfo, parse func([]byte) (C, error)) (C, error) {
	cfg, err := parse(raw)
	if err != nil {
		return cfg, err
	}
	if !host.NetAllowed {
		return cfg, fmt.Errorf("%w: the host allows no network address; add the database's IP:PORT to storage.wasm.allowed-addresses", sdk.ErrInvalid)
	}
	return cfg, nil
}

// PageBytes bounds the bytes of one scan page (NewIterator's budget), so
// that a page of 4 MiB values cannot exhaust the instance's memory: a
// quarter of the host's largest response, from 1 to 16 MiB.
func PageBytes(host sdk.HostInfo) int {
	return min(max(host.MaxResponse/4, 1<<20), 16<<20)
}

// Connect takes the instance's first connection, which Init uses to check
// the server and its table. Its errors name the server and its address,
// and an address the host refuses is INVALID with the configuration
// setting (setting, "url" or "dsn") that must match the allow-list.
func Connect[C Conn](ctx context.Context, p *Pool[C], d Driver[C], server, addr, setting string) (C, error) {
	c, _, err := p.Get(ctx)
	if err == nil {
		return c, nil
	}
	if errors.Is(err, sdk.ErrAddressNotAllowed) {
		return c, fmt.Errorf("%w: connecting to %s: %v (storage.wasm.allowed-addresses must list it exactly as in %s)", sdk.ErrInvalid, addr, err, setting)
	}
	return c, fmt.Errorf("connecting to %s at %s: %w", server, addr, d.Classify(err))
}
