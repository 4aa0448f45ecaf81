package migrate

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/internal/mvcc/transfer"
	"github.com/engramkv/engram/core/kv"
)

// ErrMismatch means the target does not hold what the source holds.
var ErrMismatch = errors.New("migrate: the target differs from the source")

// Side is one end of a verification: an etcd v3 endpoint or a local store.
type Side interface {
	// HashKV returns etcd's HashKV at rev and the compacted revision it
	// was computed with (-1: never compacted).
	HashKV(ctx context.Context, rev int64) (hash uint32, compactRev int64, err error)
	// Range returns up to limit live keys in [key, end) at rev.
	Range(ctx context.Context, key, end []byte, rev, limit int64) ([]*mvccpb.KeyValue, bool, error)
}

// Remote is an etcd v3 endpoint as a Side.
type Remote struct{ Client *clientv3.Client }

func (r Remote) HashKV(ctx context.Context, rev int64) (uint32, int64, error) {
	eps := r.Client.Endpoints()
	if len(eps) == 0 {
		return 0, 0, errors.New("migrate: no endpoint")
	}
	resp, err := r.Client.HashKV(ctx, eps[0], rev)
	if err != nil {
		return 0, 0, err
	}
	return resp.Hash, resp.CompactRevision, nil
}

func (r Remote) Range(ctx context.Context, key, end []byte, rev, limit int64) ([]*mvccpb.KeyValue, bool, error) {
	resp, err := r.Client.Get(ctx, string(key), clientv3.WithRange(string(end)), clientv3.WithRev(rev), clientv3.WithLimit(limit))
	if err != nil {
		return nil, false, err
	}
	return resp.Kvs, resp.More, nil
}

// Local is a store opened read-only, as a Side.
type Local struct{ b *mvcc.Backend }

// OpenLocal opens store for reading only (no writer, no compaction).
func OpenLocal(ctx context.Context, store kv.Store, tempDir string) (*Local, error) {
	b, err := mvcc.Open(ctx, mvcc.Options{Store: store, ReadOnly: true, TempDir: tempDir})
	if err != nil {
		return nil, err
	}
	return &Local{b: b}, nil
}

// Close releases the read-only view (not the store).
func (l *Local) Close() error { return l.b.Close() }

func (l *Local) HashKV(ctx context.Context, rev int64) (uint32, int64, error) {
	h, err := transfer.HashKV(ctx, l.b, rev)
	return h.Hash, h.CompactRev, err
}

func (l *Local) Range(ctx context.Context, key, end []byte, rev, limit int64) ([]*mvccpb.KeyValue, bool, error) {
	resp, err := l.b.Range(ctx, &pb.RangeRequest{Key: key, RangeEnd: end, Revision: rev, Limit: limit})
	if err != nil {
		return nil, false, err
	}
	return resp.Kvs, resp.More, nil
}

// VerifyOptions say what to compare.
type VerifyOptions struct {
	// Rev is the revision compared; both sides must serve it.
	Rev int64
	// Prefix limits the comparison to keys under it (a prefix migration:
	// HashKV covers the whole keyspace, so keys are compared instead).
	Prefix []byte
}

// Verify compares target with source at opts.Rev: etcd's HashKV for the
// whole keyspace, and key by key (value, create and mod revision, version,
// lease) under a prefix, to name the first difference when the hashes
// differ, or when the hashes cannot be compared. It returns a one-line
// account of what matched.
//
// HashKV skips history at or below the compacted revision it is computed
// with, so two hashes compare only when both sides report the same one.
// They differ when the source compacted during the migration (the target
// keeps the base's compacted revision and the history above it), and when
// rev is a revision the source compacted at: etcd then answers with the
// hash it computed while compacting, which reports the compaction before.
// Keys are compared then.
//
// A source that serves no HashKV (kine) is compared key by key; history
// below rev is then not compared at all.
func Verify(ctx context.Context, source, target Side, opts VerifyOptions) (string, error) {
	if len(opts.Prefix) == 0 {
		hs, cs, err := source.HashKV(ctx, opts.Rev)
		if notSupported(err) {
			key, end, err := wholeKeyspace(ctx, source, opts.Rev)
			if err != nil {
				return "", err
			}
			n, err := compareRanges(ctx, source, target, key, end, opts.Rev)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("all %d keys match at revision %d (the source serves no HashKV: each key's value, create and mod revision and lease compared, and its version where the source counts one; history below that revision is not compared)", n, opts.Rev), nil
		}
		if err != nil {
			return "", fmt.Errorf("migrate: HashKV of the source at %d: %w", opts.Rev, err)
		}
		ht, ct, err := target.HashKV(ctx, opts.Rev)
		if err != nil {
			return "", fmt.Errorf("migrate: HashKV of the target at %d: %w", opts.Rev, err)
		}
		if cs != ct {
			n, err := compareRanges(ctx, source, target, []byte{0}, []byte{0}, opts.Rev)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("all %d keys match at revision %d (HashKV not comparable: the source hashed with compacted revision %d, the target %d)", n, opts.Rev, cs, ct), nil
		}
		if hs == ht {
			return fmt.Sprintf("HashKV at revision %d is %d on both", opts.Rev, hs), nil
		}
		n, err := compareRanges(ctx, source, target, []byte{0}, []byte{0}, opts.Rev)
		if err != nil {
			return "", fmt.Errorf("%w: HashKV at revision %d is %d on the source, %d on the target: %w", ErrMismatch, opts.Rev, hs, ht, err)
		}
		return "", fmt.Errorf("%w: HashKV at revision %d is %d on the source, %d on the target, though all %d keys match at that revision: the histories differ (a version, sub revision or delete below it)", ErrMismatch, opts.Rev, hs, ht, n)
	}
	end := prefixEnd(opts.Prefix)
	n, err := compareRanges(ctx, source, target, opts.Prefix, end, opts.Rev)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("all %d keys under %q match at revision %d", n, opts.Prefix, opts.Rev), nil
}

// wholeKeyspace returns the range that covers the source's keyspace at
// rev: etcd's ("\x00" from key), unless the source lists nothing that way
// but keys in the text range (kine at a past revision; see rangeBounds).
func wholeKeyspace(ctx context.Context, source Side, rev int64) ([]byte, []byte, error) {
	for _, b := range rangeBounds {
		kvs, _, err := source.Range(ctx, []byte(b[0]), []byte(b[1]), rev, 1)
		if err != nil {
			return nil, nil, fmt.Errorf("migrate: range of the source at %d: %w", rev, err)
		}
		if len(kvs) > 0 {
			return []byte(b[0]), []byte(b[1]), nil
		}
	}
	return []byte{0}, []byte{0}, nil
}

// compareRanges walks [key, end) on both sides at rev and reports the first
// difference; it returns how many keys matched. Each side is read page by
// page on its own, so a source that lists a key twice (kine's
// compact_rev_key) does not put the two out of step; such a key is compared
// as a Get answers it (see addListed).
func compareRanges(ctx context.Context, source, target Side, key, end []byte, rev int64) (int, error) {
	src := &rangeCursor{side: source, name: "source", key: key, end: end, rev: rev}
	dst := &rangeCursor{side: target, name: "target", key: key, end: end, rev: rev}
	n := 0
	for {
		a, err := src.next(ctx)
		if err != nil {
			return n, err
		}
		b, err := dst.next(ctx)
		if err != nil {
			return n, err
		}
		switch {
		case a == nil && b == nil:
			return n, nil
		case a == nil:
			return n, fmt.Errorf("%w: key %q exists only on the target (%s)", ErrMismatch, b.Key, describe(b))
		case b == nil:
			return n, fmt.Errorf("%w: key %q exists only on the source (%s)", ErrMismatch, a.Key, describe(a))
		case !bytes.Equal(a.Key, b.Key):
			first := a.Key
			if bytes.Compare(b.Key, first) < 0 {
				first = b.Key
			}
			return n, fmt.Errorf("%w: key %q is on one side only", ErrMismatch, first)
		case !sameKV(a, b):
			return n, fmt.Errorf("%w: key %q: source %s, target %s", ErrMismatch, a.Key, describe(a), describe(b))
		}
		n++
	}
}

// rangeCursor reads one side's keys in order, a page at a time, each key
// once: a key listed twice, or at a revision no write can have, as a Get
// of it answers (maybe not at all).
type rangeCursor struct {
	side      Side
	name      string
	key, end  []byte
	rev       int64
	buf       []*mvccpb.KeyValue
	exhausted bool
}

const comparePage = 1000

func (c *rangeCursor) next(ctx context.Context) (*mvccpb.KeyValue, error) {
	// Two keys buffered (or the end reached) to see a repeated name.
	if err := c.fill(ctx); err != nil {
		return nil, err
	}
	dup := false
	for len(c.buf) >= 2 && bytes.Equal(c.buf[0].Key, c.buf[1].Key) {
		c.buf, dup = c.buf[1:], true
		if err := c.fill(ctx); err != nil {
			return nil, err
		}
	}
	if len(c.buf) == 0 {
		return nil, nil
	}
	kv := c.buf[0]
	c.buf = c.buf[1:]
	if dup || kv.ModRevision < firstWriteRev {
		kvs, _, err := c.side.Range(ctx, kv.Key, nil, c.rev, 1)
		if err != nil {
			return nil, fmt.Errorf("migrate: get %q from the %s at %d: %w", kv.Key, c.name, c.rev, err)
		}
		if len(kvs) == 0 {
			return c.next(ctx)
		}
		kv = kvs[0]
	}
	return kv, nil
}

// fill reads pages until two keys are buffered or the range is done.
func (c *rangeCursor) fill(ctx context.Context) error {
	for len(c.buf) < 2 && !c.exhausted {
		kvs, more, err := c.side.Range(ctx, c.key, c.end, c.rev, comparePage)
		if err != nil {
			return fmt.Errorf("migrate: range of the %s at %d: %w", c.name, c.rev, err)
		}
		c.buf = append(c.buf, kvs...)
		if !more || len(kvs) == 0 {
			c.exhausted = true
		} else {
			c.key = append(bytes.Clone(kvs[len(kvs)-1].Key), 0)
		}
	}
	return nil
}

// sameKV compares a source's key with the target's. A source's live key
// with version 0 comes from a source that does not count versions (kine;
// etcd never reports one): the target counted its own from 1.
func sameKV(a, b *mvccpb.KeyValue) bool {
	return a.CreateRevision == b.CreateRevision && a.ModRevision == b.ModRevision && (a.Version == b.Version || a.Version == 0) &&
		a.Lease == b.Lease && bytes.Equal(a.Value, b.Value)
}

func describe(kv *mvccpb.KeyValue) string {
	return fmt.Sprintf("create %d, mod %d, version %d, lease %x, %d-byte value", kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease, len(kv.Value))
}

// prefixEnd is etcd's range end for a prefix.
func prefixEnd(prefix []byte) []byte {
	end := bytes.Clone(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return []byte{0}
}
