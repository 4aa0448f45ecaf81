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
	h, err := l.b.HashKV(ctx, rev)
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
func Verify(ctx context.Context, source, target Side, opts VerifyOptions) (string, error) {
	if len(opts.Prefix) == 0 {
		hs, cs, err := source.HashKV(ctx, opts.Rev)
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

// compareRanges walks [key, end) on both sides at rev and reports the first
// difference; it returns how many keys matched.
func compareRanges(ctx context.Context, source, target Side, key, end []byte, rev int64) (int, error) {
	const page = 1000
	n := 0
	for {
		a, amore, err := source.Range(ctx, key, end, rev, page)
		if err != nil {
			return n, fmt.Errorf("migrate: range of the source at %d: %w", rev, err)
		}
		b, bmore, err := target.Range(ctx, key, end, rev, page)
		if err != nil {
			return n, fmt.Errorf("migrate: range of the target at %d: %w", rev, err)
		}
		for i := 0; i < len(a) || i < len(b); i++ {
			switch {
			case i >= len(a):
				return n, fmt.Errorf("%w: key %q exists only on the target (%s)", ErrMismatch, b[i].Key, describe(b[i]))
			case i >= len(b):
				return n, fmt.Errorf("%w: key %q exists only on the source (%s)", ErrMismatch, a[i].Key, describe(a[i]))
			case !bytes.Equal(a[i].Key, b[i].Key):
				first := a[i].Key
				if bytes.Compare(b[i].Key, first) < 0 {
					first = b[i].Key
				}
				return n, fmt.Errorf("%w: key %q is on one side only", ErrMismatch, first)
			case !sameKV(a[i], b[i]):
				return n, fmt.Errorf("%w: key %q: source %s, target %s", ErrMismatch, a[i].Key, describe(a[i]), describe(b[i]))
			}
			n++
		}
		if !amore && !bmore || len(a) == 0 {
			return n, nil
		}
		key = append(append([]byte(nil), a[len(a)-1].Key...), 0)
	}
}

func sameKV(a, b *mvccpb.KeyValue) bool {
	return a.CreateRevision == b.CreateRevision && a.ModRevision == b.ModRevision && a.Version == b.Version &&
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
