package migrate_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/migrate"
	"github.com/engramkv/engram/core/server/servertest"
)

// followUntil starts a migration into st with its cut-over channel open,
// runs load (which returns the source's revision after it) while the
// migration follows, waits until the migration has applied that revision,
// and stops it by cancelling its context, as Ctrl-C does. It returns that
// revision and the run's log.
func followUntil(t *testing.T, ctx context.Context, opts migrate.Options, load func() (int64, error)) (int64, string) {
	t.Helper()
	var logs logBuffer
	pl := newProgressLog(nil)
	opts.Logger, opts.Progress = logs.logger(), pl.record
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := runAsync(rctx, opts, make(chan struct{}))
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	base, err := pl.waitFor(wctx, func(p migrate.Progress) bool { return p.Phase == "follow" })
	if err != nil {
		t.Fatalf("waiting for the migration to follow: %v\nlog:\n%s", err, logs.String())
	}
	rev, err := load()
	if err != nil {
		t.Fatal(err)
	}
	if rev <= base.Applied {
		t.Fatalf("the load wrote nothing after revision %d", base.Applied)
	}
	if _, err := pl.waitFor(wctx, func(p migrate.Progress) bool { return p.Applied >= rev }); err != nil {
		t.Fatalf("waiting for the migration to apply revision %d: %v\nlog:\n%s", rev, err, logs.String())
	}
	cancel()
	r := waitRun(t, ch, 30*time.Second)
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("migrate.Run after cancel: %+v, %v; want context.Canceled\nlog:\n%s", r.res, r.err, logs.String())
	}
	return rev, logs.String()
}

// TestResume stops a migration while it follows (as Ctrl-C does), writes
// to the source, and runs it again: it resumes from the saved position
// without downloading the base again and ends identical to the source.
func TestResume(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 2*time.Minute)
	e, src := startSource(t)
	w := &writer{cli: src}
	compactRev, err := preload(ctx, w, rand.New(rand.NewPCG(3, 4)), []string{"/pre/"}, 200)
	if err != nil {
		t.Fatal(err)
	}
	st := openBadger(t, "")
	opts := migrate.Options{Client: src, Source: e.ClientURL, Store: st, TempDir: t.TempDir(), LeaseSyncInterval: 200 * time.Millisecond}

	// A first run follows a load, then is stopped.
	stopAt, log1 := followUntil(t, ctx, opts, func() (int64, error) {
		err := loadWriters(ctx, w, []string{"/a/"}, 30, 2, 50, nil)
		return w.maxRev.Load(), err
	})
	if !strings.Contains(log1, "downloaded the source's snapshot") {
		t.Fatalf("the first run did not download the base:\n%s", log1)
	}
	rec := requireUnservable(t, st)
	if rec.Applied < stopAt {
		t.Fatalf("the saved position is %d, the run had applied %d", rec.Applied, stopAt)
	}

	// The source moves on while the migration is stopped: a new lease with
	// keys, writes, deletes.
	if err := loadWriters(ctx, w, []string{"/a/", "/b/"}, 30, 2, 150, nil); err != nil {
		t.Fatal(err)
	}
	final := w.maxRev.Load()

	// A second run resumes and cuts over at once.
	var logs logBuffer
	opts.Logger = logs.logger()
	r, err := migrate.Run(ctx, opts, closed())
	if err != nil {
		t.Fatalf("resumed migration: %v\nlog:\n%s", err, logs.String())
	}
	log2 := logs.String()
	if !contains(log2, "resuming migration", fmt.Sprintf("applied=%d", rec.Applied)) || strings.Contains(log2, "downloaded the source's snapshot") {
		t.Errorf("the second run did not resume from %d without a new base:\n%s", rec.Applied, log2)
	}
	if r.Rev != final || r.CompactRev != compactRev || r.BaseRev >= rec.Applied {
		t.Errorf("result %+v; the source is at %d, compacted at %d, the first run stopped at %d", r, final, compactRev, rec.Applied)
	}

	srv := servertest.Start(t, st, servertest.Options{})
	eng := srv.Client(t)
	compareAll(t, ctx, src, eng, "", compactRev+1, final, nil)
	if p, err := eng.Put(ctx, "/after", "x"); err != nil || p.Header.Revision != final+1 {
		t.Fatalf("first write on Engram: %v, %v; want revision %d", p, err, final+1)
	}
}

// TestPrefix moves only /registry/events/ (the seed-004 split): the target
// holds only those keys, equal to the source's at every revision since the
// compaction, and resumes at the source's revision, so no client of the
// moved keys sees a revision go back.
func TestPrefix(t *testing.T) {
	t.Parallel()
	const prefix = "/registry/events/"
	ctx := testCtx(t, 2*time.Minute)
	e, src := startSource(t)
	w := &writer{cli: src}
	prefixes := []string{prefix, "/registry/pods/", "/registry/events" /* a sibling: not under the prefix */, "/other/"}
	compactRev, err := preload(ctx, w, rand.New(rand.NewPCG(5, 6)), prefixes, 100)
	if err != nil {
		t.Fatal(err)
	}
	st := openBadger(t, "")
	var logs logBuffer
	cut := make(chan struct{})
	ch := runAsync(ctx, migrate.Options{
		Client: src, Source: e.ClientURL, Store: st, TempDir: t.TempDir(), Prefix: []byte(prefix), Logger: logs.logger(),
	}, cut)
	if err := loadWriters(ctx, w, prefixes, 20, 4, 100, nil); err != nil {
		t.Fatal(err)
	}
	// The last writes change nothing under the prefix: the target must
	// still resume at the source's revision.
	for i := range 5 {
		if err := w.put(ctx, fmt.Sprintf("/registry/pods/last%d", i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	final := w.maxRev.Load()
	close(cut)
	rr := waitRun(t, ch, 60*time.Second)
	if rr.err != nil {
		t.Fatalf("migrate.Run: %v\nlog:\n%s", rr.err, logs.String())
	}
	if rr.res.Rev != final || !strings.Contains(rr.res.Verified, prefix) {
		t.Fatalf("result %+v, want revision %d verified under %q", rr.res, final, prefix)
	}

	srv := servertest.Start(t, st, servertest.Options{})
	eng := srv.Client(t)
	all, err := eng.Get(ctx, "\x00", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	if all.Header.Revision != final {
		t.Errorf("Engram is at revision %d, the source was at %d", all.Header.Revision, final)
	}
	if len(all.Kvs) == 0 {
		t.Fatal("nothing migrated")
	}
	for _, kv := range all.Kvs {
		if !bytes.HasPrefix(kv.Key, []byte(prefix)) {
			t.Fatalf("key %q is not under %q", kv.Key, prefix)
		}
	}
	want, err := src.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(final))
	if err != nil {
		t.Fatal(err)
	}
	if len(want.Kvs) != len(all.Kvs) {
		t.Errorf("the source has %d keys under %q, Engram %d", len(want.Kvs), prefix, len(all.Kvs))
	}
	msg, err := migrate.Verify(ctx, migrate.Remote{Client: src}, migrate.Remote{Client: eng}, migrate.VerifyOptions{Rev: final, Prefix: []byte(prefix)})
	if err != nil {
		t.Errorf("Verify: %v", err)
	}
	t.Logf("Verify: %s", msg)
	compareAll(t, ctx, src, eng, prefix, compactRev+1, final, nil)
	if p, err := eng.Put(ctx, prefix+"after", "x"); err != nil || p.Header.Revision != final+1 {
		t.Fatalf("first write on Engram: %v, %v; want revision %d", p, err, final+1)
	}
}

// TestSourceCompactsWhileFollowing: kube-apiserver compacts its etcd every
// five minutes, so a migration that follows for long sees compactions. The
// target takes the source's compacted revision at the cut-over, and the two
// HashKV then compare bit for bit.
func TestSourceCompactsWhileFollowing(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 2*time.Minute)
	e, src := startSource(t)
	w := &writer{cli: src}
	if _, err := preload(ctx, w, rand.New(rand.NewPCG(7, 8)), []string{"/pre/"}, 150); err != nil {
		t.Fatal(err)
	}
	st := openBadger(t, "")
	var logs logBuffer
	pl := newProgressLog(nil)
	cut := make(chan struct{})
	ch := runAsync(ctx, migrate.Options{Client: src, Source: e.ClientURL, Store: st, TempDir: t.TempDir(), Logger: logs.logger(), Progress: pl.record}, cut)
	if _, err := pl.waitFor(ctx, func(p migrate.Progress) bool { return p.Phase == "follow" }); err != nil {
		t.Fatalf("waiting for the migration to follow: %v\n%s", err, logs.String())
	}
	if err := loadWriters(ctx, w, []string{"/a/"}, 20, 2, 60, nil); err != nil {
		t.Fatal(err)
	}
	compactAt := w.maxRev.Load() - 10
	if err := w.compact(ctx, compactAt); err != nil {
		t.Fatal(err)
	}
	if err := loadWriters(ctx, w, []string{"/a/"}, 20, 2, 30, nil); err != nil {
		t.Fatal(err)
	}
	close(cut)
	r := waitRun(t, ch, time.Minute)
	if r.err != nil {
		t.Fatalf("migration: %v\n%s", r.err, logs.String())
	}
	if r.res.CompactRev != compactAt || !strings.Contains(r.res.Verified, "HashKV at revision") || !strings.Contains(r.res.Verified, "on both") {
		t.Fatalf("cut-over %+v: want the source's compacted revision %d and equal HashKV", r.res, compactAt)
	}
}
