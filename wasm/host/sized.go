package host

import (
	"context"
	"fmt"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/wasm/abi"
)

// Engine is an open plugin store, as Open and OpenFile return it: a *Store,
// or a *SizedStore when the plugin declares SIZE. The core finds out what
// an engine can do by type assertion (kv.Sizer), so whether the store has a
// Size method must follow the manifest: a Size that always failed would
// make the core believe a quota is enforced, and publish a size metric,
// for a plugin that cannot tell its size (DESIGN.md, "Size and reclamation
// through the plugin ABI").
type Engine interface {
	kv.Store
	kv.Reclaimer
	// Manifest returns what the plugin declared at INIT.
	Manifest() abi.Manifest
	// Stats returns a snapshot of the pool.
	Stats() Stats
}

// SizedStore is a Store whose plugin answers SIZE: a kv.Sizer.
type SizedStore struct {
	*Store
}

// engine returns s as the type its manifest calls for.
func (s *Store) engine() Engine {
	if s.manifest.Supports(abi.OpSize) {
		return &SizedStore{Store: s}
	}
	return s
}

// Size implements kv.Sizer with the plugin's SIZE. kv.Sizer passes no
// context, so the store's call timeout bounds it.
func (s *SizedStore) Size() (int64, error) {
	ctx := context.Background()
	in, err := s.acquire(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer s.release(in)
	st, body, err := s.call(ctx, in, abi.OpSize, func(b []byte, h abi.Header) []byte {
		return (&abi.EmptyRequest{Header: h}).Append(b)
	})
	if err != nil {
		return 0, err
	}
	if st != abi.StatusOK {
		return 0, s.statusErr(in, abi.OpSize, st, body)
	}
	n, err := abi.DecodeSize(body)
	if err != nil {
		return 0, s.protocolErr(in, abi.OpSize, fmt.Errorf("size: %w", err))
	}
	return n, nil
}

var (
	_ Engine   = (*Store)(nil)
	_ Engine   = (*SizedStore)(nil)
	_ kv.Sizer = (*SizedStore)(nil)
)
