package server_test

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/engramkv/engram/core/kv"
)

// sizedStore reports as its size the bytes of the keys and values it holds,
// exactly and at once, so a test can drive Engram over a quota without
// waiting on an engine's own size estimate (badger recomputes its own
// about once a minute).
type sizedStore struct {
	kv.Store
	n     atomic.Int64
	calls atomic.Int64 // Size calls
}

func (s *sizedStore) Size() (int64, error) {
	s.calls.Add(1)
	return s.n.Load(), nil
}

func (s *sizedStore) Commit(ctx context.Context, ops []kv.Op) error {
	var delta int64
	for _, op := range ops {
		old, err := s.Store.Get(ctx, op.Key)
		switch {
		case err == nil:
			delta -= int64(len(op.Key) + len(old))
		case !errors.Is(err, kv.ErrNotFound):
			return err
		}
		if op.Kind != kv.OpDelete && op.Kind != kv.OpCompareAndDelete {
			delta += int64(len(op.Key) + len(op.Value))
		}
	}
	if err := s.Store.Commit(ctx, ops); err != nil {
		return err
	}
	s.n.Add(delta)
	return nil
}
