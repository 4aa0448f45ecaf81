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
//     A source that serves no Snapshot (kine, k3s's etcd shim, answers "snapshot
//     is not supported") is read instead by a paginated Range of the keyspace
//     at one revision B (rangebase.go): each live key at its own create and
//     mod revision and version, no history below B, which the target then
//     reports as compacted at B.
//  2. Follow: a watch from base+1 applies each source revision with its
//     number; progress notifications advance the position past revisions
//     that changed nothing under the prefix. Each batch carries the position,
//     so an interrupted migration resumes from a whole revision.
//  3. Cut-over, once the source's writers are stopped: drain to the source's
//     revision Rf, sync leases, verify (HashKV at Rf for the whole keyspace,
//     a key-by-key comparison under a prefix or when the source serves no
//     HashKV), and make the store servable at revision Rf in one batch.
//
// Every wait on the source during the base copy is bounded by an idle
// timeout, so a partitioned source ends the migration with ErrSourceIdle
// instead of hanging it; and the target is checked empty before anything
// is downloaded.
//
// It owns the protocol with the source; writing records is mvcc's importer,
// the snapshot file package snapshot's. It must not serve clients: until the
// cut-over completes the store holds an import record and no server opens
// it.
//
// It is public because `engram migrate` (cmd/engram) and the Kubernetes
// suite's migrated backend (tests/k8s) run it.
package migrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/internal/mvcc/transfer"
	"github.com/engramkv/engram/core/kv"
)

// ErrSourceCompacted means the source compacted past the migration's
// position: the revisions in between are gone, so it must start over.
var ErrSourceCompacted = errors.New("migrate: the source compacted past the migration's position")

// ErrSourceIdle means the source sent nothing for the idle timeout while
// the base was copied: it is unreachable or stalled.
var ErrSourceIdle = errors.New("migrate: the source stopped sending")

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
	// Base says how the base is copied: BaseAuto (the default) takes the
	// source's snapshot, or a paginated Range when the source serves no
	// Snapshot.
	Base BaseMode
	// IdleTimeout bounds how long the base copy waits for the source to
	// send anything (a snapshot chunk, a page); 0 means 30 s.
	IdleTimeout time.Duration
	// PageSize is the number of keys per page of a Range base; 0 means
	// 1000.
	PageSize int64
}

// BaseMode says how a migration copies the source's base.
type BaseMode string

const (
	// BaseAuto takes the snapshot, or a Range when Snapshot is not served.
	BaseAuto BaseMode = ""
	// BaseSnapshot takes the source's Maintenance.Snapshot: every revision
	// above the source's compacted revision, with leases, users and roles.
	BaseSnapshot BaseMode = "snapshot"
	// BaseRange reads the live keys at one revision by a paginated Range:
	// no history below it, no users or roles.
	BaseRange BaseMode = "range"
)

// ParseBaseMode parses a --base flag value.
func ParseBaseMode(s string) (BaseMode, error) {
	switch BaseMode(s) {
	case BaseSnapshot, BaseRange:
		return BaseMode(s), nil
	case "auto", BaseAuto:
		return BaseAuto, nil
	}
	return "", fmt.Errorf("unknown base mode %q: want auto, snapshot or range", s)
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
	// BaseRev and CompactRev are the base's revision and compacted
	// revision; Rev the revision the target resumes at.
	BaseRev, CompactRev, Rev int64
	// Base is how the base was copied: BaseSnapshot or BaseRange.
	Base BaseMode
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
	// AuthRev is the auth revision of the base snapshot, whose users and
	// roles the target has.
	AuthRev     uint64 `json:"auth_rev,omitempty"`
	AuthEnabled bool   `json:"auth_enabled,omitempty"`
	// Base is how the base was copied ("" from before Range bases:
	// snapshot).
	Base BaseMode `json:"base,omitempty"`
	// NoLeaseAPI says the source serves no lease API (kine): a key's lease
	// ID is taken as its TTL in seconds, kine's convention.
	NoLeaseAPI bool `json:"no_lease_api,omitempty"`
}

// base returns how the base was copied.
func (p phase) base() BaseMode {
	if p.Base == BaseAuto {
		return BaseSnapshot
	}
	return p.Base
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
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = 30 * time.Second
	}
	if opts.PageSize <= 0 {
		opts.PageSize = 1000
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
	im   *transfer.Importer
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
			m.ph = ph
			im, err := transfer.NewImporter(ctx, m.resumeOptions(rec))
			if err != nil {
				return err
			}
			m.im = im
			m.log.Info("resuming migration", "source", rec.Source, "applied", im.Record().Applied)
			return nil
		}
		m.log.Info("the earlier migration stopped during the base copy; starting it again", "source", rec.Source)
	}
	if prev != nil && prev.Kind == rec.Kind && prev.Source != rec.Source && !m.opts.Restart {
		return fmt.Errorf("%w: the store holds an unfinished migration from %s; use --restart to discard it", transfer.ErrNotEmpty, prev.Source)
	}
	// Before any download: an unfinished migration is ours to start
	// over; anything else refuses the store.
	if prev == nil || prev.Kind != rec.Kind {
		if err := transfer.CheckEmpty(ctx, m.opts.Store); err != nil {
			return fmt.Errorf("migrate: the target: %w", err)
		}
	}
	if m.opts.Base == BaseRange {
		return m.rangeBase(ctx, rec)
	}
	err = m.snapshotBase(ctx, rec)
	if errors.Is(err, errNoSnapshot) && m.opts.Base == BaseAuto {
		m.log.Warn("the source serves no snapshot; copying its keys at one revision by a paginated Range instead (no history below that revision is kept)", "err", err)
		return m.rangeBase(ctx, rec)
	}
	return err
}

// resumeOptions are the importer's options to continue the migration
// whose import record is rec: a Range base's source may not count versions
// (kine), and its watch events carry none either.
func (m *migration) resumeOptions(rec mvcc.ImportRecord) transfer.ImportOptions {
	return transfer.ImportOptions{Store: m.opts.Store, Logger: m.log, Record: rec, Resume: true, CountVersions: m.ph.base() == BaseRange}
}

func (m *migration) source() string {
	if len(m.opts.Prefix) == 0 {
		return m.opts.Source
	}
	return fmt.Sprintf("%s (prefix %q)", m.opts.Source, m.opts.Prefix)
}

// flush commits what was imported so far together with the phase, so an
// interrupted migration resumes from this position.
func (m *migration) flush(ctx context.Context) error {
	extra, _ := json.Marshal(m.ph)
	m.im.SetExtra(extra)
	return m.im.Flush(ctx)
}

// report passes p to the caller's Progress callback, if any.
func (m *migration) report(p Progress) {
	if m.opts.Progress != nil {
		m.opts.Progress(p)
	}
}
