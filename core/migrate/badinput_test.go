package migrate_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/internal/mvcc/transfer"
	"github.com/engramkv/engram/core/migrate"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/internal/etcdtest"
)

// deadSourceBound is how long a migration may take to notice that its
// source is gone: a lease sync (every LeaseSyncInterval) or another call
// to the source fails after the migration's 15 s call timeout, a progress
// request during the cut-over after 5 s.
const deadSourceBound = 40 * time.Second

// TestSourceUnreachable stops the source while the migration follows: Run
// ends with an error within a bounded time, the store stays unservable with
// its position saved, and a run against the restarted source resumes and
// completes.
func TestSourceUnreachable(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 2*time.Minute)
	e, src := startSource(t)
	w := &writer{cli: src}
	compactRev, err := preload(ctx, w, rand.New(rand.NewPCG(7, 8)), []string{"/pre/"}, 100)
	if err != nil {
		t.Fatal(err)
	}
	st := openBadger(t, "")
	// The source keeps its name across the restart (its port changes).
	opts := migrate.Options{Client: src, Source: "source-under-test", Store: st, TempDir: t.TempDir(), LeaseSyncInterval: 500 * time.Millisecond}

	var logs logBuffer
	pl := newProgressLog(nil)
	o := opts
	o.Logger, o.Progress = logs.logger(), pl.record
	ch := runAsync(ctx, o, make(chan struct{}))
	if _, err := pl.waitFor(ctx, func(p migrate.Progress) bool { return p.Phase == "follow" }); err != nil {
		t.Fatal(err)
	}
	if err := loadWriters(ctx, w, []string{"/a/"}, 20, 2, 50, nil); err != nil {
		t.Fatal(err)
	}
	applied := w.maxRev.Load()
	if _, err := pl.waitFor(ctx, func(p migrate.Progress) bool { return p.Applied >= applied }); err != nil {
		t.Fatal(err)
	}
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	r := waitRun(t, ch, deadSourceBound)
	took := time.Since(stopped)
	if r.err == nil || errors.Is(r.err, context.Canceled) || errors.Is(r.err, context.DeadlineExceeded) && ctx.Err() != nil {
		t.Fatalf("migrate.Run with the source gone: %+v, %v", r.res, r.err)
	}
	t.Logf("the source stopped; Run returned after %v: %v", took.Round(time.Millisecond), r.err)
	if rec := requireUnservable(t, st); rec.Applied < applied {
		t.Fatalf("saved position %d, the migration had applied %d", rec.Applied, applied)
	}

	// The source comes back (on other ports); the migration resumes.
	e2 := etcdtest.Start(t, etcdtest.Options{DataDir: e.DataDir})
	src2 := dial(t, e2.Endpoint)
	w2 := &writer{cli: src2}
	if err := loadWriters(ctx, w2, []string{"/b/"}, 20, 1, 30, nil); err != nil {
		t.Fatal(err)
	}
	logs = logBuffer{}
	opts.Client, opts.Logger = src2, logs.logger()
	res, err := migrate.Run(ctx, opts, closed())
	if err != nil {
		t.Fatalf("resumed migration: %v\nlog:\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), "resuming migration") {
		t.Errorf("the run after the restart did not resume:\n%s", logs.String())
	}
	if res.Rev != w2.maxRev.Load() {
		t.Errorf("result %+v, want revision %d", res, w2.maxRev.Load())
	}
	srv := servertest.Start(t, st, servertest.Options{})
	compareSome(t, ctx, src2, srv.Client(t), "", compactRev+1, res.Rev, 20, nil)
}

// TestSourceUnreachableDuringCutover stops the source the moment the
// cut-over has read the revision to drain to, before the migration has
// applied it (a prefix migration learns that revisions outside the prefix
// are done only from a progress notification, which it then requests): Run
// must end with an error, not wait forever for a watch that reconnects to a
// source that is gone; a run against the restarted source completes.
func TestSourceUnreachableDuringCutover(t *testing.T) {
	t.Parallel()
	const prefix = "/p/"
	ctx := testCtx(t, 2*time.Minute)
	e, src := startSource(t)
	w := &writer{cli: src}
	compactRev, err := preload(ctx, w, rand.New(rand.NewPCG(15, 16)), []string{prefix, "/q/"}, 60)
	if err != nil {
		t.Fatal(err)
	}
	st := openBadger(t, "")
	var (
		logs    logBuffer
		stopped time.Time
	)
	following := make(chan int64, 1)
	opts := migrate.Options{
		Client: src, Source: "source-under-test", Store: st, TempDir: t.TempDir(), Prefix: []byte(prefix),
		Following: func(from int64) { following <- from },
		// The source goes away right after the cut-over has read the
		// revision to drain to.
		Logger: newHookLogger(&logs, "cut-over: draining", func() {
			if err := e.Stop(); err != nil {
				t.Error(err)
			}
			stopped = time.Now()
		}),
	}
	cut := make(chan struct{})
	ch := runAsync(ctx, opts, cut)
	select {
	case <-following:
	case r := <-ch:
		t.Fatalf("migrate.Run: %+v, %v", r.res, r.err)
	}
	// Writes outside the prefix: the revision to drain to is one no
	// event under the prefix brings.
	if err := loadWriters(ctx, w, []string{"/q/"}, 10, 1, 10, nil); err != nil {
		t.Fatal(err)
	}
	close(cut)
	r := waitRun(t, ch, deadSourceBound)
	if r.err == nil || stopped.IsZero() {
		t.Fatalf("migrate.Run: %+v, %v; the source stopped at %v\nlog:\n%s", r.res, r.err, stopped, logs.String())
	}
	t.Logf("the source stopped during the cut-over; Run returned after %v: %v", time.Since(stopped).Round(time.Millisecond), r.err)
	requireUnservable(t, st)

	e2 := etcdtest.Start(t, etcdtest.Options{DataDir: e.DataDir})
	src2 := dial(t, e2.Endpoint)
	logs = logBuffer{}
	opts.Client, opts.Logger, opts.Following = src2, logs.logger(), nil
	res, err := migrate.Run(ctx, opts, closed())
	if err != nil {
		t.Fatalf("resumed migration: %v\nlog:\n%s", err, logs.String())
	}
	if res.Rev != w.maxRev.Load() || !strings.Contains(logs.String(), "resuming migration") {
		t.Fatalf("result %+v, want a resumed migration at %d\nlog:\n%s", res, w.maxRev.Load(), logs.String())
	}
	srv := servertest.Start(t, st, servertest.Options{})
	compareSome(t, ctx, src2, srv.Client(t), prefix, compactRev+1, res.Rev, 20, nil)
}

// TestSourceCompacted compacts the source past a stopped migration's
// position: the resumed run fails with ErrSourceCompacted and leaves the
// store as it was; a run with Restart starts over and completes. A
// compaction at the revision right after the position loses nothing (etcd
// 3.6 keeps the changes of the compacted revision, deletes included): the
// migration resumes.
func TestSourceCompacted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// past writes and compacts the source after the migration stopped
		// at revision applied, and returns the compacted revision.
		past func(ctx context.Context, w *writer, applied int64) (int64, error)
		// resumes: the run after past resumes and completes.
		resumes bool
	}{
		{name: "far", past: func(ctx context.Context, w *writer, applied int64) (int64, error) {
			if err := loadWriters(ctx, w, []string{"/b/"}, 20, 2, 30, nil); err != nil {
				return 0, err
			}
			return w.maxRev.Load(), w.compact(ctx, w.maxRev.Load())
		}},
		// The smallest compaction that loses a revision the migration
		// needs.
		{name: "two past", past: func(ctx context.Context, w *writer, applied int64) (int64, error) {
			if err := loadWriters(ctx, w, []string{"/b/"}, 20, 1, 5, nil); err != nil {
				return 0, err
			}
			return applied + 2, w.compact(ctx, applied+2)
		}},
		{name: "next revision, a delete", resumes: true, past: func(ctx context.Context, w *writer, applied int64) (int64, error) {
			r, err := w.cli.Get(ctx, "/a/", clientv3.WithPrefix(), clientv3.WithLimit(1))
			if err != nil {
				return 0, err
			}
			if len(r.Kvs) == 0 {
				return 0, errors.New("no key to delete")
			}
			if err := w.del(ctx, string(r.Kvs[0].Key)); err != nil {
				return 0, err
			}
			if w.maxRev.Load() != applied+1 {
				return 0, errors.New("the delete is not the next revision")
			}
			if err := w.compact(ctx, applied+1); err != nil {
				return 0, err
			}
			return applied + 1, w.put(ctx, "/b/after", "x")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t, 2*time.Minute)
			e, src := startSource(t)
			w := &writer{cli: src}
			if _, err := preload(ctx, w, rand.New(rand.NewPCG(9, 10)), []string{"/pre/"}, 100); err != nil {
				t.Fatal(err)
			}
			st := openBadger(t, "")
			opts := migrate.Options{Client: src, Source: e.ClientURL, Store: st, TempDir: t.TempDir()}
			applied, _ := followUntil(t, ctx, opts, func() (int64, error) {
				err := loadWriters(ctx, w, []string{"/a/"}, 20, 2, 30, nil)
				return w.maxRev.Load(), err
			})
			rec := requireUnservable(t, st)
			if rec.Applied != applied {
				t.Fatalf("saved position %d, want %d", rec.Applied, applied)
			}
			compacted, err := tc.past(ctx, w, applied)
			if err != nil {
				t.Fatal(err)
			}
			final := w.maxRev.Load()

			var logs logBuffer
			opts.Logger = logs.logger()
			res, err := migrate.Run(ctx, opts, closed())
			if tc.resumes {
				if err != nil {
					t.Fatalf("resuming after a compaction at the next revision: %v\nlog:\n%s", err, logs.String())
				}
				if !strings.Contains(logs.String(), "resuming migration") {
					t.Errorf("did not resume:\n%s", logs.String())
				}
			} else {
				if !errors.Is(err, migrate.ErrSourceCompacted) {
					t.Fatalf("resuming past the source's compaction: %v, want ErrSourceCompacted\nlog:\n%s", err, logs.String())
				}
				t.Logf("resume: %v", err)
				if rec2 := requireUnservable(t, st); rec2.Applied != rec.Applied {
					t.Fatalf("the failed resume moved the position from %d to %d", rec.Applied, rec2.Applied)
				}
				opts.Restart = true
				if res, err = migrate.Run(ctx, opts, closed()); err != nil {
					t.Fatalf("restarted migration: %v", err)
				}
				if res.BaseRev <= applied || res.CompactRev != compacted {
					t.Fatalf("restarted migration: %+v, want a new base compacted at %d", res, compacted)
				}
			}
			if res.Rev != final {
				t.Fatalf("result %+v, want revision %d", res, final)
			}
			t.Logf("verified: %s", res.Verified)
			srv := servertest.Start(t, st, servertest.Options{})
			eng := srv.Client(t)
			if res.CompactRev < compacted {
				// The target keeps the base's compacted revision and more
				// history than the source; compacted alike, their HashKVs
				// compare.
				if _, err := eng.Compact(ctx, compacted, clientv3.WithCompactPhysical()); err != nil {
					t.Fatal(err)
				}
			}
			compareSome(t, ctx, src, eng, "", compacted+1, final, 20, nil)
		})
	}
}

// TestNonEmptyTarget refuses a store holding Engram data, and one holding
// an unfinished migration from another source, leaving both untouched.
func TestNonEmptyTarget(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 2*time.Minute)
	e, src := startSource(t)
	w := &writer{cli: src}
	if _, err := preload(ctx, w, rand.New(rand.NewPCG(11, 12)), []string{"/pre/"}, 60); err != nil {
		t.Fatal(err)
	}

	t.Run("engram data", func(t *testing.T) {
		st := openBadger(t, "")
		srv := servertest.Start(t, st, servertest.Options{})
		c := srv.Client(t)
		for _, k := range []string{"/mine/a", "/mine/b"} {
			if _, err := c.Put(ctx, k, "keep"); err != nil {
				t.Fatal(err)
			}
		}
		before, err := c.Get(ctx, "\x00", clientv3.WithFromKey())
		if err != nil {
			t.Fatal(err)
		}
		srv.Stop()

		var logs logBuffer
		_, err = migrate.Run(ctx, migrate.Options{Client: src, Source: e.ClientURL, Store: st, TempDir: t.TempDir(), Logger: logs.logger()}, closed())
		if !errors.Is(err, transfer.ErrNotEmpty) {
			t.Fatalf("migrating into a store with data: %v, want ErrNotEmpty", err)
		}
		if !contains(err.Error(), `2 keys, the first "/mine/a"`) {
			t.Fatalf("the refusal does not name what the store holds: %v", err)
		}
		// Refused before anything was read from the source.
		if l := logs.String(); contains(l, "downloaded") || contains(l, "snapshot") || contains(l, "Range") {
			t.Fatalf("the source was read before the store was refused:\n%s", l)
		}
		t.Logf("refused: %v", err)
		srv = servertest.Start(t, st, servertest.Options{})
		after, err := srv.Client(t).Get(ctx, "\x00", clientv3.WithFromKey())
		if err != nil {
			t.Fatal(err)
		}
		if after.Header.Revision != before.Header.Revision || len(after.Kvs) != len(before.Kvs) {
			t.Fatalf("the store changed: revision %d -> %d, %d -> %d keys", before.Header.Revision, after.Header.Revision, len(before.Kvs), len(after.Kvs))
		}
	})

	t.Run("another source's migration", func(t *testing.T) {
		st := openBadger(t, "")
		var logs logBuffer
		opts := migrate.Options{Client: src, Source: "first", Store: st, TempDir: t.TempDir(), Logger: logs.logger()}
		applied, _ := followUntil(t, ctx, opts, func() (int64, error) {
			err := w.put(ctx, "/x", "y")
			return w.maxRev.Load(), err
		})
		opts.Source = "second"
		_, err := migrate.Run(ctx, opts, closed())
		if !errors.Is(err, transfer.ErrNotEmpty) {
			t.Fatalf("migrating into a store holding another source's migration: %v, want ErrNotEmpty", err)
		}
		if rec := requireUnservable(t, st); rec.Applied != applied || !strings.Contains(rec.Source, "first") {
			t.Fatalf("the refused run changed the import record: %+v", rec)
		}
		opts.Restart = true
		if _, err := migrate.Run(ctx, opts, closed()); err != nil {
			t.Fatalf("with Restart: %v", err)
		}
	})
}

// TestCutoverUnderLoad asks for the cut-over while writers still run. The
// migration must not cut over at a revision the source has already left:
// it fails with ErrNotQuiet after its retries (or, when the writers end
// first, cuts over at a revision the source held and verified), leaving a
// store that is either unservable or exactly the source's at that revision;
// once the writers stop, a run completes.
func TestCutoverUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 2*time.Minute)
	e, src := startSource(t)
	w := &writer{cli: src}
	compactRev, err := preload(ctx, w, rand.New(rand.NewPCG(13, 14)), []string{"/pre/"}, 100)
	if err != nil {
		t.Fatal(err)
	}
	st := openBadger(t, "")
	var logs logBuffer
	pl := newProgressLog(nil)
	opts := migrate.Options{Client: src, Source: e.ClientURL, Store: st, TempDir: t.TempDir(), Logger: logs.logger(), Progress: pl.record}
	cut := make(chan struct{})
	ch := runAsync(ctx, opts, cut)
	if _, err := pl.waitFor(ctx, func(p migrate.Progress) bool { return p.Phase == "follow" }); err != nil {
		t.Fatal(err)
	}

	// Writers of a bounded count, stopped early once Run returns. A
	// migration that applies more slowly than they write drains only once
	// they are done.
	stop := make(chan struct{})
	loadDone := make(chan error, 1)
	go func() { loadDone <- loadWriters(ctx, w, []string{"/a/"}, 30, 2, 500, stop) }()
	for {
		acked := w.nextAck()
		if w.ops.Load() >= 50 {
			break
		}
		select {
		case err := <-loadDone:
			t.Fatalf("load ended early: %v", err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-acked:
		}
	}
	cutRev := w.maxRev.Load()
	close(cut)
	r := waitRun(t, ch, 60*time.Second)
	close(stop)
	if err := <-loadDone; err != nil {
		t.Fatal(err)
	}
	srcNow := w.maxRev.Load()
	if r.err == nil {
		// A quiet moment: the store is the source's at r.res.Rev.
		if r.res.Rev < cutRev {
			t.Fatalf("cut over at %d, before the revision %d the source had when asked", r.res.Rev, cutRev)
		}
		t.Logf("cut over under load at %d (the source went on to %d): %s", r.res.Rev, srcNow, r.res.Verified)
		srv := servertest.Start(t, st, servertest.Options{})
		compareSome(t, ctx, src, srv.Client(t), "", compactRev+1, r.res.Rev, 20, nil)
		return
	}
	if !errors.Is(r.err, migrate.ErrNotQuiet) {
		t.Fatalf("cut-over under load: %v, want ErrNotQuiet\nlog:\n%s", r.err, logs.String())
	}
	t.Logf("cut-over under load refused: %v", r.err)
	requireUnservable(t, st)

	// The writers are stopped now: the same store completes.
	logs = logBuffer{}
	opts.Logger, opts.Progress = logs.logger(), nil
	res, err := migrate.Run(ctx, opts, closed())
	if err != nil {
		t.Fatalf("cut-over after the writers stopped: %v\nlog:\n%s", err, logs.String())
	}
	if res.Rev != srcNow || !strings.Contains(logs.String(), "resuming migration") {
		t.Fatalf("result %+v, want a resumed migration at %d\nlog:\n%s", res, srcNow, logs.String())
	}
	srv := servertest.Start(t, st, servertest.Options{})
	compareSome(t, ctx, src, srv.Client(t), "", compactRev+1, res.Rev, 20, nil)
}
