package mvcc

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/internal/tso"
	"github.com/engramkv/engram/core/kv"
)

// The change log read back as watch events: a watcher that starts below the
// hub's memory, or falls behind, replays history from here.

// Events returns the committed events with revisions in [from, to], in
// revision order, stopping after the revision that brings the count to at
// least max. next is the first revision not returned. prev_kv is filled for
// every event whose key existed before.
func (b *Backend) Events(ctx context.Context, from, to int64, limit int) (events []*mvccpb.Event, next int64, err error) {
	// An empty store's revision has no change; the first record is at the
	// revision after it.
	from = max(from, tso.FirstRevision+1)
	if from > to {
		return nil, from, nil
	}
	unpin, err := b.pin(from)
	if err != nil {
		return nil, from, err
	}
	defer unpin()
	it, err := b.store.Scan(ctx, kv.ScanOptions{Start: coder.EventKey(from), End: coder.EventKey(to + 1), BatchSize: 256})
	if err != nil {
		return nil, from, storageErr("scan change log", err)
	}
	defer it.Close()
	next = from
	for {
		batch, err := it.Next(ctx)
		if err != nil {
			return nil, from, storageErr("scan change log", err)
		}
		if len(batch) == 0 {
			return events, to + 1, nil
		}
		for _, p := range batch {
			rev, err := coder.DecodeEventKey(p.Key)
			if err != nil {
				return nil, from, err
			}
			if rev != next {
				return nil, from, fmt.Errorf("mvcc: change log jumps from revision %d to %d: %w", next, rev, errBadRecord)
			}
			changes, err := decodeChanges(p.Value)
			if err != nil {
				return nil, from, err
			}
			for _, c := range changes {
				ev, err := b.materialize(ctx, rev, c)
				if err != nil {
					return nil, from, err
				}
				events = append(events, ev)
			}
			next = rev + 1
			if len(events) >= limit {
				return events, next, nil
			}
		}
	}
}

// versionExactly reads the version of key written at rev: from history if a
// later write superseded it, else from the revision key.
func (b *Backend) versionExactly(ctx context.Context, key []byte, rev int64) (entry, error) {
	raw, err := b.store.Get(ctx, coder.ObjectKey(key, rev))
	if errors.Is(err, kv.ErrNotFound) {
		raw, err = b.latestRecord(ctx, key)
		if err == nil {
			if h, _, derr := decodeHeader(raw); derr == nil && h.ModRev != rev {
				// Superseded between the two reads: it is in history now.
				raw, err = b.store.Get(ctx, coder.ObjectKey(key, rev))
			}
		}
	}
	if err != nil {
		return entry{}, storageErr(fmt.Sprintf("get %q@%d", key, rev), err)
	}
	h, val, err := decodeHeader(raw)
	if err != nil {
		return entry{}, err
	}
	h.ModRev = rev
	return entry{key: key, hdr: h, value: val}, nil
}

// materialize builds the watch event of one change-log entry from history.
func (b *Backend) materialize(ctx context.Context, rev int64, c Change) (*mvccpb.Event, error) {
	ev := &mvccpb.Event{}
	if c.Deleted {
		ev.Type = mvccpb.DELETE
		ev.Kv = &mvccpb.KeyValue{Key: c.Key, ModRevision: rev}
	} else {
		e, err := b.versionOfChange(ctx, rev, c)
		if err != nil {
			return nil, err
		}
		ev.Type = mvccpb.PUT
		ev.Kv = e.keyValue(true)
	}
	if c.PrevRev > 0 {
		pe := entry{key: c.Key, hdr: Version{ModRev: c.PrevRev}}
		raw, err := b.store.Get(ctx, coder.ObjectKey(c.Key, c.PrevRev))
		h, val, found, err := decodeRead(raw, err, "get previous object")
		if err != nil {
			return nil, err
		}
		// Not found: compacted away; etcd leaves prev_kv unset then too.
		if found {
			h.ModRev = c.PrevRev
			pe.hdr, pe.value = h, val
			ev.PrevKv = pe.keyValue(true)
		}
	}
	return ev, nil
}

// versionOfChange reads the version a put change wrote: from the change
// itself when a later change of its revision superseded it, else from
// history or the revision key.
func (b *Backend) versionOfChange(ctx context.Context, rev int64, c Change) (entry, error) {
	if c.Superseded == nil {
		return b.versionExactly(ctx, c.Key, rev)
	}
	h, val, err := decodeHeader(c.Superseded)
	if err != nil {
		return entry{}, err
	}
	return entry{key: c.Key, hdr: h, value: val}, nil
}
