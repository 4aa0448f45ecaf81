package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/engramkv/engram/cmd/engram/internal/config"
	"github.com/engramkv/engram/core/backup"
	"github.com/engramkv/engram/core/snapshot"
)

// snapshotMain is `engram snapshot restore|status FILE`.
func snapshotMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		snapshotUsage(stdout)
		return 0
	}
	switch args[0] {
	case "restore":
		return snapshotRestore(args[1:], stdout, stderr)
	case "status":
		return snapshotStatus(args[1:], stdout, stderr)
	default:
		fmt.Fprintf(stderr, "engram snapshot: unknown command %q\n\n", args[0])
		snapshotUsage(stderr)
		return 2
	}
}

func snapshotUsage(w io.Writer) {
	fmt.Fprint(w, `Usage:
  engram snapshot restore FILE [flags]   restore an etcd snapshot into the configured, empty store
  engram snapshot status FILE [-w json]  describe an etcd snapshot file

FILE is an etcd snapshot: what 'etcdctl snapshot save' writes from etcd or
from Engram. Take a snapshot of Engram with 'etcdctl snapshot save FILE'.
restore takes the same configuration as 'engram serve' (flags, ENGRAM_*
variables, --config FILE) to open the store; run 'engram snapshot restore
--help' for its flags.
`)
}

const restoreUsage = `Usage: engram snapshot restore FILE [flags]

Restores an etcd snapshot file into the store that 'engram serve' with the
same configuration opens, keeping every key's revisions, the leases with
their IDs and TTLs, and the compacted revision. The store must be empty (a
restore that stopped part-way is started again). Stop the server first.
`

func snapshotRestore(args []string, stdout, stderr io.Writer) int {
	var skipHash, markCompacted bool
	var bump int64
	cfg, rest, err := config.LoadCommand(args, stdout, &config.Command{
		Usage: restoreUsage,
		Args:  1,
		Flags: func(fs *pflag.FlagSet) {
			fs.BoolVar(&skipHash, "skip-hash-check", false, "accept a file without the sha256 trailer 'snapshot save' appends (e.g. a copied member/snap/db)")
			fs.Int64Var(&bump, "bump-revision", 0, "raise the restored revision by this much (requires --mark-compacted), for restoring an older backup under live clients")
			fs.BoolVar(&markCompacted, "mark-compacted", false, "compact at the restored revision, so watchers and caches start again from fresh data")
		},
	})
	if errors.Is(err, config.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "engram snapshot restore: %v\n\nRun 'engram snapshot restore --help' for usage.\n", err)
		return 2
	}
	file := rest[0]
	logger := newLogger(cfg.Log, stderr)
	cfg.WarnUnknownEnv(logger)
	if os.Getenv("GOGC") == "" {
		// A restore's heap is mostly the sort's and the engine's
		// short-lived buffers: collecting at half the live heap instead
		// of all of it cut the peak RSS of a million-object restore
		// from 1.72 to 1.43 GiB at the same time (DESIGN.md, "Bulk
		// restore").
		debug.SetGCPercent(50)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	store, err := openStore(ctx, cfg, logger.With("component", "storage"), nil)
	if err != nil {
		fmt.Fprintf(stderr, "engram snapshot restore: %v\n", err)
		return 1
	}
	start := time.Now()
	info, err := backup.Restore(ctx, store, file, backup.RestoreOptions{
		Logger:        logger,
		SkipHashCheck: skipHash,
		BumpRevision:  bump,
		MarkCompacted: markCompacted,
		TempDir:       restoreTempDir(cfg.DataDir),
		Progress: func(rows, total int64) {
			if total == 0 {
				logger.Info("restoring", "rows", rows)
				return
			}
			logger.Info("restoring", "rows", rows, "of", total)
		},
	})
	if cerr := store.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("close store: %w", cerr)
	}
	if err != nil {
		fmt.Fprintf(stderr, "engram snapshot restore: %v\n", err)
		return 1
	}
	took := time.Since(start)
	mb := float64(info.Snapshot.TotalSize) / (1 << 20)
	fmt.Fprintf(stdout, "restored %s into storage.engine=%s: %d versions, %d leases, revision %d, compacted revision %d (%.1f MB in %s, %.1f MB/s)\n",
		file, cfg.Storage.Engine, info.Rows, info.Leases, info.Rev, info.CompactRev, mb, took.Round(time.Millisecond), mb/took.Seconds())
	if a := info.Auth; a != nil {
		state := "off"
		if a.Enabled {
			state = "on"
		}
		fmt.Fprintf(stdout, "restored auth (%s): %d users, %d roles, auth revision %d\n", state, len(a.Users), len(a.Roles), a.Revision)
	}
	return 0
}

// restoreTempDir is where a restore's sort files go: beside the data
// rather than in a /tmp that may be memory, when the engine keeps its files
// in dataDir; the system's temporary directory for the others (TiKV, memkv).
func restoreTempDir(dataDir string) string {
	if fi, err := os.Stat(dataDir); err == nil && fi.IsDir() {
		return dataDir
	}
	return ""
}

func snapshotStatus(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("engram snapshot status", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	format := fs.StringP("write-out", "w", "table", "output format: table or json")
	skipHash := fs.Bool("skip-hash-check", false, "describe a file without the sha256 trailer")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 || (*format != "table" && *format != "json") {
		if err == nil {
			err = errors.New("want exactly one FILE argument and -w table|json")
		}
		fmt.Fprintf(stderr, "engram snapshot status: %v\n\n", err)
		snapshotUsage(stderr)
		return 2
	}
	f, err := snapshot.Open(fs.Arg(0), snapshot.OpenOptions{SkipHashCheck: *skipHash})
	if err != nil {
		fmt.Fprintf(stderr, "engram snapshot status: %v\n", err)
		return 1
	}
	defer f.Close()
	info := f.Info()
	leases, err := f.Leases()
	if err != nil {
		fmt.Fprintf(stderr, "engram snapshot status: %v\n", err)
		return 1
	}
	if *format == "json" {
		out := map[string]any{
			"hash": info.Hash, "revision": info.Revision, "compactRevision": info.CompactRev,
			"totalKey": info.TotalKeys, "totalSize": info.TotalSize, "version": info.StorageVersion,
			"leases": len(leases), "hashTrailer": info.HasHashTrailer,
		}
		enc := json.NewEncoder(stdout)
		if err := enc.Encode(out); err != nil {
			fmt.Fprintf(stderr, "engram snapshot status: %v\n", err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stdout, "%-10s %-10s %-12s %-10s %-12s %-8s %-7s\n", "HASH", "REVISION", "COMPACTED", "TOTAL KEYS", "TOTAL SIZE", "VERSION", "LEASES")
	fmt.Fprintf(stdout, "%-10x %-10d %-12d %-10d %-12s %-8s %-7d\n", info.Hash, info.Revision, info.CompactRev, info.TotalKeys, humanBytes(info.TotalSize), info.StorageVersion, len(leases))
	return 0
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f kB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
