package tikv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	pkgerrors "github.com/pkg/errors"
	tikverr "github.com/tikv/client-go/v2/error"
	"github.com/tikv/client-go/v2/oracle"
	"github.com/tikv/client-go/v2/testutils"
	tikvclient "github.com/tikv/client-go/v2/tikv"

	"github.com/engramkv/engram/core/kv"
)

// TestClassify pins the error table documented on classify, with errors
// wrapped the way client-go wraps them (github.com/pkg/errors).
func TestClassify(t *testing.T) {
	conflict := pkgerrors.WithStack(tikverr.NewErrWriteConflictWithArgs(1, 2, 3, []byte("k"), 0))
	undetermined := pkgerrors.WithStack(tikverr.ErrResultUndetermined)
	regionErr := pkgerrors.Errorf("backoffer.maxSleep 40000ms is exceeded, errors:\nregion_miss: not leader")
	for _, tc := range []struct {
		name        string
		err         error
		commitPhase bool
		want        errClass
	}{
		{"undetermined in commit", undetermined, true, uncertain},
		{"undetermined before commit", undetermined, false, uncertain},
		{"region errors in commit", regionErr, true, uncertain},
		{"deadline in commit", pkgerrors.WithStack(context.DeadlineExceeded), true, uncertain},
		{"txn not found in commit", pkgerrors.Errorf("txn %d not found", 7), true, uncertain},
		{"write conflict at prewrite", conflict, false, retry},
		{"write conflict, wrapped again", fmt.Errorf("prewrite: %w", conflict), false, retry},
		{"latch conflict", &tikverr.ErrWriteConflictInLatch{StartTS: 1}, false, retry},
		{"retryable", pkgerrors.WithStack(&tikverr.ErrRetryable{Retryable: "try again"}), false, retry},
		{"region errors at prewrite", regionErr, false, notApplied},
		{"deadline at prewrite", pkgerrors.WithStack(context.DeadlineExceeded), false, notApplied},
		{"PD timeout", tikverr.NewErrPDServerTimeout("tso"), false, notApplied},
		{"entry too large", &tikverr.ErrEntryTooLarge{Limit: 1, Size: 2}, false, notApplied},
		{"server busy", pkgerrors.WithStack(tikverr.ErrTiKVServerBusy), false, notApplied},
	} {
		if got := classify(tc.err, tc.commitPhase); got != tc.want {
			t.Errorf("%s: classify(%v, commitPhase=%v) = %v, want %v", tc.name, tc.err, tc.commitPhase, got, tc.want)
		}
	}
}

func TestPrefixEnd(t *testing.T) {
	for _, tc := range []struct{ p, want string }{
		{"engram/", "engram0"},
		{"a", "b"},
		{"a\xff", "b"},
		{"\xfe\xff\xff", "\xff"},
		{"\xff\xff", ""},
		{"", ""},
	} {
		got := prefixEnd([]byte(tc.p))
		if !bytes.Equal(got, []byte(tc.want)) || (tc.want == "") != (got == nil) {
			t.Errorf("prefixEnd(%q) = %q, want %q", tc.p, got, tc.want)
		}
	}
	for _, p := range []string{"", "\xff", "\xff\xff"} {
		if checkPrefix([]byte(p)) == nil {
			t.Errorf("checkPrefix(%q) accepted a prefix without an end", p)
		}
	}
}

func TestValueFraming(t *testing.T) {
	for _, v := range [][]byte{nil, {}, []byte("x"), {valueTag}, {0, 0}} {
		got, err := decodeValue(encodeValue(v))
		if err != nil || !bytes.Equal(got, v) {
			t.Errorf("decode(encode(%q)) = %q, %v", v, got, err)
		}
	}
	for _, raw := range [][]byte{nil, {}, []byte("plain")} {
		if _, err := decodeValue(raw); err == nil {
			t.Errorf("decodeValue(%q) accepted a value without the tag", raw)
		}
	}
}

// newMock builds a Store on a fresh single-region mock cluster (package
// tikvmock cannot be used here: it imports this package).
func newMock(t *testing.T, opts Options) *Store {
	t.Helper()
	client, cluster, pdClient, err := testutils.NewMockTiKV("", nil)
	if err != nil {
		t.Fatal(err)
	}
	testutils.BootstrapWithSingleStore(cluster)
	kvs, err := tikvclient.NewTestTiKVStore(client, pdClient, nil, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Prefix == nil {
		opts.Prefix = []byte("t/")
	}
	s, err := New(kvs, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestGC checks that a GC run registers the service safe point, advances
// the cluster's safe point to now-lifeTime and keeps the latest versions.
func TestGC(t *testing.T) {
	ctx := context.Background()
	s := newMock(t, Options{})
	for i := range 3 {
		if err := s.Commit(ctx, []kv.Op{kv.Put([]byte("k"), fmt.Appendf(nil, "v%d", i)), kv.Put(fmt.Appendf(nil, "d%d", i), nil)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Commit(ctx, []kv.Op{kv.Delete([]byte("d0"))}); err != nil {
		t.Fatal(err)
	}
	// Another user of the cluster (TiDB's GC worker, BR, another Engram)
	// holds a safe point an hour back: GC must not pass it.
	pd := s.kvs.GetPDClient()
	other := oracle.GoTimeToTS(time.Now().Add(-time.Hour))
	if _, err := pd.UpdateServiceGCSafePoint(ctx, "other", 3600, other); err != nil {
		t.Fatal(err)
	}
	sp, err := s.GC(ctx, time.Second)
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	if sp != other {
		t.Errorf("GC safe point %v, want it held back at the other service's %v", oracle.GetTimeFromTS(sp), oracle.GetTimeFromTS(other))
	}
	if _, err := pd.UpdateServiceGCSafePoint(ctx, "other", 0, 0); err != nil { // the other service leaves
		t.Fatal(err)
	}
	before := time.Now()
	sp, err = s.GC(ctx, time.Second)
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	if at := oracle.GetTimeFromTS(sp); at.After(before) || at.Before(before.Add(-time.Minute)) {
		t.Errorf("GC safe point at %v, want about %v", at, before.Add(-time.Second))
	}
	if got, err := pd.UpdateGCSafePoint(ctx, 0); err != nil || got != sp {
		t.Errorf("cluster GC safe point = %d, %v; want %d", got, err, sp)
	}
	// The latest versions survive; deleted keys stay deleted.
	if v, err := s.Get(ctx, []byte("k")); err != nil || string(v) != "v2" {
		t.Errorf("Get(k) after GC = %q, %v; want v2", v, err)
	}
	if _, err := s.Get(ctx, []byte("d0")); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("Get(d0) after GC = %v, want ErrNotFound", err)
	}
	if v, err := s.Get(ctx, []byte("d1")); err != nil || len(v) != 0 {
		t.Errorf("Get(d1) after GC = %q, %v; want the empty value", v, err)
	}
}

// TestGCLoop runs the background GC with a short interval and checks that
// Close stops it.
func TestGCLoop(t *testing.T) {
	runs := make(chan struct{}, 1)
	s := newMock(t, Options{GCInterval: 20 * time.Millisecond, GCLifeTime: time.Nanosecond,
		Logger: slog.New(gcRunHandler{runs: runs})})
	// A run logs once it has set the safe point; the ten seconds only guard
	// against a hang.
	select {
	case <-runs:
	case <-time.After(10 * time.Second):
		t.Fatal("the background GC never completed a run")
	}
	got, err := s.kvs.GetPDClient().UpdateGCSafePoint(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if got == 0 {
		t.Fatal("the background GC ran but did not advance the safe point")
	}
	// The life time is raised to the one-minute floor.
	if at := oracle.GetTimeFromTS(got); at.After(time.Now().Add(-minGCLifeTime + 5*time.Second)) {
		t.Errorf("background GC safe point %v keeps less than %v of history", at, minGCLifeTime)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.gc.Done():
	default:
		t.Error("GC loop still running after Close")
	}
}

// gcRunHandler is a slog handler that signals runs (at most one pending)
// for each completed background GC run and drops every record.
type gcRunHandler struct{ runs chan struct{} }

func (h gcRunHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h gcRunHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "TiKV GC done" {
		select {
		case h.runs <- struct{}{}:
		default:
		}
	}
	return nil
}

func (h gcRunHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h gcRunHandler) WithGroup(string) slog.Handler      { return h }
