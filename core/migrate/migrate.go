// Package migrate moves a running etcd (or any etcd v3 endpoint, another
// Engram included) into an Engram store with every revision intact, so
// clients holding resourceVersions from the source keep working after the
// switch: no relist, no missed or repeated watch event, no revision going
// backwards.
//
// How (see also the README's runbook):
//
//  1. Base: the source's Maintenance.Snapshot, the one consistent read etcd
//     offers that carries sub revisions, leases and every version above the
//     compacted revision C. It is imported (only keys under the prefix, when
//     one is given) with its exact revisions, so a watch can resume on the
//     target from any revision in (C, base].
//  2. Follow: a watch from base+1 applies each source revision with its
//     number; progress notifications advance the position past revisions
//     that changed nothing under the prefix. Each batch carries the position,
//     so an interrupted migration resumes from a whole revision.
//  3. Cut-over, once the source's writers are stopped: drain to the source's
//     revision Rf, sync leases, verify (HashKV at Rf for the whole keyspace,
//     a key-by-key comparison under a prefix), and make the store servable
//     at revision Rf in one batch.
//
// It owns the protocol with the source; writing records is mvcc's importer,
// the snapshot file package snapshot's. It must not serve clients: until the
// cut-over completes the store holds an import record and no server opens
// it.
package migrate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/snapshot"
)

// ErrSourceCompacted means the source compacted past the migration's
// position: the revisions in between are gone, so it must start over.
var ErrSourceCompacted = errors.New("migrate: the source compacted past the migration's position")

// ErrNotQuiet means the source kept changing during the cut-over: its
// writers were not all stopped.
var ErrNotQuiet = errors.New("migrate: the source kept changing during the cut-over")

// Options configure a migration.
type Options struct {
	// Client talks to the source; Source names it in the import record (a
	// migration resumes only from the same Source and Prefix).
	Client *clientv3.Client
	Source string
	// Store is the target, opened by the caller; Engram must not serve it
	// while the migration runs.
	Store kv.Store
	// Prefix, when set, moves only the keys under it. The target still
	// resumes at the source's revision, so no client sees it go back.
	Prefix []byte
	// Restart discards an unfinished migration into Store and starts over.
	Restart bool
	// TempDir holds the downloaded base snapshot.
	TempDir string
	Logger  *slog.Logger
	// Progress is called about once a second.
	Progress func(Progress)
	// LeaseSyncInterval is how often leases are synced while following;
	// 0 means 10 s.
	LeaseSyncInterval time.Duration
	// Following, if set, is called once the base is in place and the
	// migration follows the source from revision from.
	Following func(from int64)
}

// Progress is a migration's state for a progress line.
type Progress struct {
	Phase string // "base", "follow", "cutover"
	// Rows imported by the base copy.
	Rows int64
	// Applied is the last source revision fully applied; SourceRev the
	// source's revision last seen.
	Applied, SourceRev int64
	// Rate is revisions applied per second since the last report.
	Rate float64
}

// Result describes a completed cut-over.
type Result struct {
	// BaseRev and CompactRev are the base snapshot's revision and
	// compacted revision; Rev the revision the target resumes at.
	BaseRev, CompactRev, Rev int64
	// Verified says how the target was checked against the source.
	Verified string
	// Drain is the time from the cut-over request to a verified store.
	Drain time.Duration
}

// callTimeout bounds each unary call to the source, so an unreachable
// source ends the migration with an error (its position saved) instead of
// hanging.
const callTimeout = 15 * time.Second

// phase is the resume state kept in the import record's Extra.
type phase struct {
	Phase   string `json:"phase"` // "base" or "follow"
	BaseRev int64  `json:"base_rev"`
	Prefix  []byte `json:"prefix,omitempty"`
}

// Run migrates until ctx ends (returning ctx's error with the position
// saved: run again to resume) or cutover is signalled, then cuts over and
// returns the result. A nil cutover channel that is already closed means
// the source's writers are stopped: copy, catch up and cut over at once.
func Run(ctx context.Context, opts Options, cutover <-chan struct{}) (Result, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.LeaseSyncInterval <= 0 {
		opts.LeaseSyncInterval = 10 * time.Second
	}
	m := &migration{opts: opts, log: opts.Logger}
	if err := m.start(ctx); err != nil {
		return Result{}, err
	}
	return m.follow(ctx, cutover)
}

type migration struct {
	opts Options
	log  *slog.Logger
	im   *mvcc.Importer
	ph   phase
	rows int64
	// sourceRev is the source's highest revision seen.
	sourceRev int64
	lastSync  time.Time
}

// start resumes an unfinished migration of the same source, or copies the
// base.
func (m *migration) start(ctx context.Context) error {
	rec := mvcc.ImportRecord{Kind: "migrate", Source: m.source()}
	prev, err := mvcc.ReadImportRecord(ctx, m.opts.Store)
	if err != nil {
		return err
	}
	if prev != nil && !m.opts.Restart && prev.Kind == rec.Kind && prev.Source == rec.Source {
		var ph phase
		if err := json.Unmarshal(prev.Extra, &ph); err == nil && ph.Phase == "follow" {
			im, err := mvcc.NewImporter(ctx, mvcc.ImportOptions{Store: m.opts.Store, Logger: m.log, Record: rec, Resume: true})
			if err != nil {
				return err
			}
			m.im, m.ph = im, ph
			m.log.Info("resuming migration", "source", rec.Source, "applied", im.Record().Applied)
			return nil
		}
		m.log.Info("the earlier migration stopped during the base copy; starting it again", "source", rec.Source)
	}
	if prev != nil && prev.Kind == rec.Kind && prev.Source != rec.Source && !m.opts.Restart {
		return fmt.Errorf("%w: the store holds an unfinished migration from %s; use --restart to discard it", mvcc.ErrNotEmpty, prev.Source)
	}
	return m.base(ctx, rec)
}

func (m *migration) source() string {
	if len(m.opts.Prefix) == 0 {
		return m.opts.Source
	}
	return fmt.Sprintf("%s (prefix %q)", m.opts.Source, m.opts.Prefix)
}

// base downloads the source's snapshot and imports it.
func (m *migration) base(ctx context.Context, rec mvcc.ImportRecord) error {
	path, err := m.download(ctx)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	f, err := snapshot.Open(path, snapshot.OpenOptions{})
	if err != nil {
		return fmt.Errorf("migrate: the source's snapshot: %w", err)
	}
	defer f.Close()
	info := f.Info()
	rec.CompactRev = info.CompactRev
	m.ph = phase{Phase: "base", BaseRev: info.Revision, Prefix: m.opts.Prefix}
	rec.Extra, _ = json.Marshal(m.ph)
	im, err := mvcc.NewImporter(ctx, mvcc.ImportOptions{Store: m.opts.Store, Logger: m.log, Record: rec})
	if err != nil {
		return err
	}
	m.im = im
	leases, err := f.Leases()
	if err != nil {
		return err
	}
	for _, l := range leases {
		if err := im.Lease(l.ID, max(l.TTL, 1)); err != nil {
			return err
		}
	}
	m.log.Info("importing the base snapshot", "revision", info.Revision, "compacted", info.CompactRev, "rows", info.TotalKeys)
	last := time.Now()
	err = f.Entries(ctx, func(e *etcdfmt.Entry) error {
		if !bytes.HasPrefix(e.KV.Key, m.opts.Prefix) {
			return nil
		}
		m.rows++
		if time.Since(last) > time.Second {
			last = time.Now()
			m.report(Progress{Phase: "base", Rows: m.rows, SourceRev: info.Revision})
		}
		return im.Add(ctx, e)
	})
	if err != nil {
		return fmt.Errorf("migrate: import the base: %w", err)
	}
	if err := im.Advance(ctx, info.Revision); err != nil {
		return err
	}
	m.ph.Phase = "follow"
	m.sourceRev = info.Revision
	return m.flush(ctx)
}

// download saves the source's snapshot stream to a file, sha256 trailer
// included, for snapshot.Open to verify.
func (m *migration) download(ctx context.Context) (string, error) {
	rc, err := m.opts.Client.Snapshot(ctx)
	if err != nil {
		return "", fmt.Errorf("migrate: snapshot of the source: %w", err)
	}
	defer rc.Close()
	f, err := os.CreateTemp(m.opts.TempDir, "engram-migrate-base-*.db")
	if err != nil {
		return "", fmt.Errorf("migrate: %w", err)
	}
	n, err := io.Copy(f, rc)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("migrate: snapshot of the source (after %d bytes): %w", n, err)
	}
	m.log.Info("downloaded the source's snapshot", "bytes", n, "file", filepath.Base(f.Name()))
	return f.Name(), nil
}

func (m *migration) flush(ctx context.Context) error {
	extra, _ := json.Marshal(m.ph)
	m.im.SetExtra(extra)
	return m.im.Flush(ctx)
}

func (m *migration) report(p Progress) {
	if m.opts.Progress != nil {
		m.opts.Progress(p)
	}
}

// watchRange is the source range the migration follows.
func (m *migration) watchOpts(from int64) (string, []clientv3.OpOption) {
	opts := []clientv3.OpOption{clientv3.WithRev(from), clientv3.WithProgressNotify()}
	if len(m.opts.Prefix) == 0 {
		return "\x00", append(opts, clientv3.WithFromKey())
	}
	return string(m.opts.Prefix), append(opts, clientv3.WithPrefix())
}

// follow applies the source's revisions until the cut-over.
func (m *migration) follow(ctx context.Context, cutover <-chan struct{}) (Result, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	applied := m.im.Record().Applied
	key, wopts := m.watchOpts(applied + 1)
	wch := m.opts.Client.Watch(wctx, key, wopts...)
	if m.opts.Following != nil {
		m.opts.Following(applied + 1)
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var (
		cutStart  time.Time
		target    int64 // the source revision to drain to, once cutting over
		attempts  int
		lastRep   = time.Now()
		lastApply = applied
	)
	startCutover := func() error {
		rev, err := m.sourceRevision(ctx)
		if err != nil {
			return err
		}
		target = rev
		m.log.Info("cut-over: draining to the source's revision", "revision", target, "applied", m.im.Record().Applied)
		return m.requestProgress(wctx)
	}
	for {
		if a := m.im.Record().Applied; target != 0 && a >= target {
			done := false
			var res Result
			if a == target {
				var err error
				res, done, err = m.cutover(ctx, target)
				if err != nil || done {
					res.Drain = time.Since(cutStart)
					return res, err
				}
			} else {
				m.log.Warn("the source moved during the cut-over; draining again", "from", target, "to", a)
			}
			attempts++
			if attempts >= 5 {
				return Result{}, fmt.Errorf("%w: revision moved past %d %d times; stop every writer (kube-apiserver, controllers, lease holders) first", ErrNotQuiet, target, attempts)
			}
			if err := startCutover(); err != nil {
				return Result{}, err
			}
		}
		select {
		case <-ctx.Done():
			if err := m.flush(context.WithoutCancel(ctx)); err != nil {
				return Result{}, err
			}
			return Result{}, ctx.Err()
		case <-cutover:
			cutover = nil
			cutStart = time.Now()
			if err := m.flush(ctx); err != nil {
				return Result{}, err
			}
			if err := startCutover(); err != nil {
				return Result{}, err
			}
		case <-tick.C:
			if target != 0 {
				// Ask again: a progress request is answered only once
				// the watch has caught up.
				if err := m.requestProgress(wctx); err != nil {
					return Result{}, err
				}
			}
			if time.Since(m.lastSync) > m.opts.LeaseSyncInterval {
				if err := m.syncLeases(ctx); err != nil {
					return Result{}, err
				}
			}
			if m.opts.Progress != nil {
				m.pollSourceRevision(ctx)
			}
			a := m.im.Record().Applied
			m.report(Progress{Phase: phaseName(target), Applied: a, SourceRev: max(m.sourceRev, a), Rate: float64(a-lastApply) / time.Since(lastRep).Seconds()})
			lastApply, lastRep = a, time.Now()
		case resp, ok := <-wch:
			if !ok {
				if ctx.Err() != nil {
					continue
				}
				return Result{}, errors.New("migrate: the source closed the watch")
			}
			if err := m.apply(ctx, resp); err != nil {
				return Result{}, err
			}
			// Commit once the watch has nothing more queued: one
			// engine commit per burst, not per revision.
			if len(wch) == 0 {
				if err := m.flush(ctx); err != nil {
					return Result{}, err
				}
			}
		}
	}
}

func phaseName(target int64) string {
	if target != 0 {
		return "cutover"
	}
	return "follow"
}

// apply imports one watch response.
func (m *migration) apply(ctx context.Context, resp clientv3.WatchResponse) error {
	if resp.CompactRevision != 0 {
		return fmt.Errorf("%w: it compacted at revision %d, the migration is at %d; run again with --restart (pause the source's compaction, e.g. kube-apiserver --etcd-compaction-interval=0, while migrating)", ErrSourceCompacted, resp.CompactRevision, m.im.Record().Applied)
	}
	if err := resp.Err(); err != nil {
		return fmt.Errorf("migrate: watch of the source: %w", err)
	}
	if resp.Header.Revision > m.sourceRev {
		m.sourceRev = resp.Header.Revision
	}
	if resp.IsProgressNotify() {
		return m.im.Advance(ctx, resp.Header.Revision)
	}
	var sub int64
	for i, ev := range resp.Events {
		if i > 0 && ev.Kv.ModRevision != resp.Events[i-1].Kv.ModRevision {
			sub = 0
		}
		row := etcdfmt.Entry{Rev: etcdfmt.Revision{Main: ev.Kv.ModRevision, Sub: sub}}
		sub++
		if ev.Type == mvccpb.DELETE {
			row.Tombstone = true
			row.KV = mvccpb.KeyValue{Key: ev.Kv.Key, ModRevision: ev.Kv.ModRevision}
		} else {
			row.KV = *ev.Kv
			if l := ev.Kv.Lease; l != 0 && !m.im.HasLease(l) {
				if err := m.fetchLease(ctx, l); err != nil {
					return err
				}
			}
		}
		if err := m.im.Add(ctx, &row); err != nil {
			return fmt.Errorf("migrate: apply revision %d: %w", row.Rev.Main, err)
		}
	}
	return nil
}

// fetchLease imports a lease granted at the source after the last sync.
func (m *migration) fetchLease(ctx context.Context, id int64) error {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	r, err := m.opts.Client.TimeToLive(cctx, clientv3.LeaseID(id))
	if err != nil {
		return fmt.Errorf("migrate: lease %x of the source: %w", id, err)
	}
	if r.TTL == -1 {
		// Revoked or expired since: its keys' deletes follow.
		return nil
	}
	return m.im.Lease(id, max(r.GrantedTTL, 1))
}

// syncLeases makes the target's leases the source's: new ones granted,
// revoked ones dropped.
func (m *migration) syncLeases(ctx context.Context) error {
	m.lastSync = time.Now()
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := m.opts.Client.Leases(cctx)
	if err != nil {
		return fmt.Errorf("migrate: list the source's leases: %w", err)
	}
	at := map[int64]bool{}
	for _, l := range resp.Leases {
		at[int64(l.ID)] = true
		if !m.im.HasLease(int64(l.ID)) {
			if err := m.fetchLease(ctx, int64(l.ID)); err != nil {
				return err
			}
		}
	}
	for _, id := range m.im.Leases() {
		if !at[id] {
			m.im.DropLease(id)
		}
	}
	return nil
}

// progressTimeout bounds handing a progress request to the watch stream.
const progressTimeout = 5 * time.Second

// requestProgress asks the source's watch (wctx's stream) for a progress
// notification. It is bounded: clientv3 hands the request to the stream's
// goroutine (no round trip: that is at once), which does not take it while
// it reconnects to a source that is gone, and wctx has no deadline, so an
// unbounded call would hang the migration during the cut-over instead of
// ending it with an error.
func (m *migration) requestProgress(wctx context.Context) error {
	cctx, cancel := context.WithTimeout(wctx, progressTimeout)
	defer cancel()
	if err := m.opts.Client.RequestProgress(cctx); err != nil {
		return fmt.Errorf("migrate: request progress: %w", err)
	}
	return nil
}

// pollSourceRevision raises sourceRev to the source's current revision, for
// the progress report's "revisions behind": the watch's own headers lag as
// far as the migration does, so they would show it caught up when it is
// not. Bounded by a short timeout; a failure is left to the calls that
// must succeed (the lease sync).
func (m *migration) pollSourceRevision(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if r, err := m.opts.Client.Get(cctx, "\x00", clientv3.WithCountOnly()); err == nil && r.Header.Revision > m.sourceRev {
		m.sourceRev = r.Header.Revision
	}
}

// sourceRevision reads the source's current revision.
func (m *migration) sourceRevision(ctx context.Context) (int64, error) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	r, err := m.opts.Client.Get(cctx, "\x00", clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("migrate: read the source's revision: %w", err)
	}
	return r.Header.Revision, nil
}

// cutover completes the migration at revision target, once everything up
// to it is applied: it verifies the source did not move, makes the store
// servable, and verifies it against the source. done is false when the
// source moved on (the import record is back and following continues).
func (m *migration) cutover(ctx context.Context, target int64) (Result, bool, error) {
	if err := m.syncLeases(ctx); err != nil {
		return Result{}, false, err
	}
	if err := m.flush(ctx); err != nil {
		return Result{}, false, err
	}
	if rev, err := m.sourceRevision(ctx); err != nil {
		return Result{}, false, err
	} else if rev != target {
		m.log.Warn("the source moved during the cut-over; draining again", "from", target, "to", rev)
		return Result{}, false, nil
	}
	rec := m.im.Record()
	// The target takes the source's compacted revision as it is now (the
	// source's compactor may have run while the migration followed): both
	// then refuse the same old revisions, and their HashKV, which depends
	// on it, compare.
	source := &hashMemo{Side: Remote{Client: m.opts.Client}, rev: target}
	cctx, cancel := context.WithTimeout(ctx, hashTimeout)
	source.hash, source.compact, source.err = source.Side.HashKV(cctx, target)
	cancel()
	if source.err != nil {
		return Result{}, false, fmt.Errorf("migrate: HashKV of the source at %d: %w", target, source.err)
	}
	compact := min(max(rec.CompactRev, source.compact), target)
	res := Result{BaseRev: m.ph.BaseRev, CompactRev: compact, Rev: target}
	if err := m.im.Finish(ctx, mvcc.FinishOptions{Rev: target, CompactRev: compact}); err != nil {
		return res, false, err
	}
	verified, err := m.verify(ctx, source, target)
	if err == nil {
		if rev, rerr := m.sourceRevision(ctx); rerr != nil {
			err = rerr
		} else if rev != target {
			err = fmt.Errorf("%w: revision %d while verifying at %d", ErrNotQuiet, rev, target)
		}
	}
	if err != nil {
		// Not servable after all: put the import record back.
		if rerr := mvcc.Unfinish(ctx, m.opts.Store, rec); rerr != nil {
			return res, false, errors.Join(err, rerr)
		}
		if errors.Is(err, ErrNotQuiet) {
			m.log.Warn("the source moved during verification; draining again", "err", err)
			m.im, err = mvcc.NewImporter(ctx, mvcc.ImportOptions{Store: m.opts.Store, Logger: m.log, Record: rec, Resume: true})
			return res, false, err
		}
		return res, false, err
	}
	res.Verified = verified
	return res, true, nil
}

// verify compares the finished store with the source at rev.
func (m *migration) verify(ctx context.Context, source Side, rev int64) (string, error) {
	local, err := OpenLocal(ctx, m.opts.Store, m.opts.TempDir)
	if err != nil {
		return "", err
	}
	defer local.Close()
	return Verify(ctx, source, local, VerifyOptions{Rev: rev, Prefix: m.opts.Prefix})
}

// hashTimeout bounds the source's HashKV at the cut-over: it reads the
// whole keyspace, so it may take far longer than other calls.
const hashTimeout = 10 * time.Minute

// hashMemo is a Side whose HashKV at rev was already asked: the cut-over
// needs it before finishing (for the compacted revision) and to verify, and
// it costs a read of the source's whole keyspace.
type hashMemo struct {
	Side
	rev     int64
	hash    uint32
	compact int64
	err     error
}

func (h *hashMemo) HashKV(ctx context.Context, rev int64) (uint32, int64, error) {
	if rev == h.rev {
		return h.hash, h.compact, h.err
	}
	return h.Side.HashKV(ctx, rev)
}
