// Package backup moves a whole store in and out as an etcd snapshot file:
// Save writes what a Backend holds, with its revisions and the auth state
// (users, roles, passwords' bcrypt hashes, the enabled switch), as the file
// `etcdctl snapshot save` would have written had the store been etcd, and
// Restore imports such a file (made by etcd or by Engram) into an empty
// store with every revision, lease and the compacted revision intact.
//
// It owns the glue only: reading and writing the file is package snapshot's,
// the format etcdfmt's, and writing records with given revisions mvcc's
// (a restore is mvcc's bulk import through the engine's kv.BulkLoader). It
// must not serve anything or open engines.
//
// It is public because `engram snapshot restore` (cmd/engram) runs Restore on
// a store the binary opened; Save is reached through the server's Snapshot
// RPC.
package backup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/core/internal/auth"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/internal/mvcc/transfer"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/snapshot"
)

// Save writes b's current state and the history it keeps, and the auth
// state persisted in store (users, roles, the enabled switch), as an etcd
// snapshot file at path (which must not exist), without a hash trailer (the
// Snapshot RPC adds it as it streams). Memory stays bounded: rows are put in
// revision order by an external sort spilling to tempDir.
func Save(ctx context.Context, b *mvcc.Backend, store kv.Store, path, tempDir string) (snapshot.Info, error) {
	a, err := auth.Export(ctx, store)
	if err != nil {
		return snapshot.Info{}, fmt.Errorf("backup: %w", err)
	}
	sorter := etcdfmt.NewSorter(tempDir, 0)
	defer sorter.Close()
	info, err := transfer.Export(ctx, b, 0, func(e *etcdfmt.Entry) error { return sorter.Add(e) })
	if err != nil {
		return snapshot.Info{}, fmt.Errorf("backup: export: %w", err)
	}
	out, err := snapshot.Write(ctx, path, snapshot.WriteOptions{CompactRev: info.CompactRev, Revision: info.Rev, Leases: info.Leases, Auth: a},
		func(yield func(*etcdfmt.Entry) error) error { return sorter.Each(ctx, yield) })
	if err != nil {
		return snapshot.Info{}, fmt.Errorf("backup: write %s: %w", path, err)
	}
	return out, nil
}

// RestoreOptions shape a restore, as etcdutl's flags do.
type RestoreOptions struct {
	Logger *slog.Logger
	// SkipHashCheck accepts a file without a sha256 trailer (a copy of a
	// data directory's db file rather than a `snapshot save`).
	SkipHashCheck bool
	// BumpRevision raises the restored revision by this much, so clients
	// holding revisions from after the backup never see the store go
	// backwards; it requires MarkCompacted, as in etcdutl.
	BumpRevision int64
	// MarkCompacted compacts at the restored revision, so every watcher
	// and cached list must start again from fresh data (kube-apiserver's
	// informers relist) instead of resuming across the restore.
	MarkCompacted bool
	// Progress, if set, is called now and then with the rows restored
	// and the file's total, 0 while the total is unknown (the file is
	// not counted before its hash is checked).
	Progress func(rows, total int64)
	// TempDir holds the restore's sort files, about the size of the
	// snapshot's key bucket at most ("": the system's temporary directory).
	TempDir string
}

// RestoreInfo describes a completed restore.
type RestoreInfo struct {
	Snapshot snapshot.Info
	// Rev and CompactRev are what the restored store opens at.
	Rev, CompactRev int64
	Rows            int64
	Leases          int
	// Auth is the auth state restored with the data; nil when the file
	// held none.
	Auth *snapshot.Auth
}

// Restore imports the snapshot file at path into store, which must be empty
// (or hold an earlier restore that did not finish, which is replaced). It
// bulk-loads the store (transfer.BulkImport; the engine's kv.BulkLoader, or
// batched Commits): nothing is servable until the load finishes.
func Restore(ctx context.Context, store kv.Store, path string, opts RestoreOptions) (RestoreInfo, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.BumpRevision < 0 {
		return RestoreInfo{}, fmt.Errorf("backup: --bump-revision %d is negative", opts.BumpRevision)
	}
	if opts.BumpRevision > 0 && !opts.MarkCompacted {
		return RestoreInfo{}, errors.New("backup: --bump-revision requires --mark-compacted: revisions between the backup and the bumped one never existed, so no watcher may resume inside them")
	}
	// The import decodes and checks every row as it sorts them: Open
	// need not do it first. The sha256 is checked while the rows are
	// read and sorted, and known before anything is loaded (Rows below).
	f, err := snapshot.Open(path, snapshot.OpenOptions{SkipHashCheck: opts.SkipHashCheck, SkipRowScan: true, DeferHashCheck: true})
	if err != nil {
		return RestoreInfo{}, err
	}
	defer f.Close()
	info := f.Info()
	// A compaction etcd had scheduled but not finished is the compacted
	// revision clients see (etcd resumes it on start); the store compacts
	// the rest of that history when it opens.
	out := RestoreInfo{Snapshot: info, Rev: info.Revision + opts.BumpRevision, CompactRev: max(info.CompactRev, info.ScheduledCompactRev)}
	if opts.MarkCompacted {
		out.CompactRev = out.Rev
	}
	leases, err := f.Leases()
	if err != nil {
		return RestoreInfo{}, err
	}
	imported := make([]transfer.ImportLease, 0, len(leases))
	for _, l := range leases {
		ttl := l.TTL
		if ttl <= 0 {
			// etcd never grants a lease below 1 s; a file saying so
			// was not written by etcd's lessor. Keep the lease alive
			// rather than drop its keys.
			opts.Logger.Warn("lease with a non-positive TTL in the snapshot; restoring it with 1 s", "lease", fmt.Sprintf("%x", l.ID), "ttl", l.TTL)
			ttl = 1
		}
		imported = append(imported, transfer.ImportLease{ID: l.ID, TTL: ttl})
	}
	out.Leases = len(leases)
	// The users and roles are loaded with the data, so a store that had
	// auth on is never served with it off. A file without them still
	// writes an empty state: it replaces one an unfinished restore of
	// another file may have left.
	a, err := f.Auth()
	if err != nil {
		return RestoreInfo{}, fmt.Errorf("backup: restore %s: %w", path, err)
	}
	authRecords, err := auth.ImportRecords(ctx, store, a)
	if err != nil {
		return RestoreInfo{}, fmt.Errorf("backup: restore %s: %w", path, err)
	}
	var progress func(int64)
	if opts.Progress != nil {
		progress = func(rows int64) { opts.Progress(rows, int64(info.Rows)) }
	}
	out.Rows, err = transfer.BulkImport(ctx, transfer.BulkImportOptions{
		Store:  store,
		Loader: kv.BulkLoaderOf(store, 0),
		Logger: opts.Logger,
		Record: mvcc.ImportRecord{Kind: "restore", Source: path, CompactRev: info.CompactRev},
		Leases: imported,
		Rows: func(yield func(*etcdfmt.Entry) error) error {
			// The sort copies each row as it comes: no need for
			// Entries' own copy.
			if err := f.EntriesView(ctx, yield); err != nil {
				return err
			}
			// Rows is done before the load starts: a damaged file
			// never reaches the store.
			if err := f.VerifyHash(); err != nil {
				return err
			}
			// Read once: unmapping the file gives back its pages
			// (as large as the file) before the load.
			return f.Close()
		},
		Meta:     authRecords,
		Finish:   transfer.FinishOptions{Rev: out.Rev, CompactRev: out.CompactRev},
		TempDir:  opts.TempDir,
		Progress: progress,
	})
	if err != nil {
		return RestoreInfo{}, fmt.Errorf("backup: restore %s: %w", path, err)
	}
	if !a.Empty() {
		out.Auth = a
	}
	if opts.Progress != nil {
		opts.Progress(out.Rows, out.Rows)
	}
	return out, nil
}

// TempFile returns a fresh path in dir for a snapshot being built; the
// caller removes it.
func TempFile(dir string) (string, error) {
	f, err := os.CreateTemp(dir, "engram-snapshot-*.db")
	if err != nil {
		return "", fmt.Errorf("backup: temporary snapshot file: %w", err)
	}
	name := f.Name()
	f.Close()
	// snapshot.Write creates the file itself and refuses an existing one.
	if err := os.Remove(name); err != nil {
		return "", fmt.Errorf("backup: temporary snapshot file: %w", err)
	}
	return name, nil
}
