package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/engramkv/engram/cmd/engram/internal/config"
	"github.com/engramkv/engram/core/migrate"
)

const migrateUsage = `Usage:
  engram migrate --from URL [flags]          copy a running etcd into the configured store and follow it
  engram migrate verify --from URL [flags]   compare a source with the migrated store

migrate copies the source's keyspace with every revision (its snapshot), then
follows its changes, each revision applied with its own number, until the
cut-over: stop every writer of the source (kube-apiserver), then send SIGUSR1
to this process, or stop it (Ctrl-C saves its position) and run it again with
--cutover. It drains to the source's last revision, verifies the store against
the source, makes it servable at that revision and exits; then start 'engram
serve' with the same configuration and switch the clients' endpoints.

A source that serves no snapshot (kine, k3s's etcd shim) is copied instead by
a paginated Range of its keys at one revision B (also --base=range): each key
keeps its value, create and mod revision, version and lease, but no history
below B is kept, so the store reports itself compacted at B (a client watching
from an older revision relists), and no users or roles are copied. kine counts
no versions: those keys get version 1 and count up from there. kine's lease IDs
are their TTLs in seconds; the store grants them so, counted from when it
starts serving. Without HashKV at the source (kine), the verification compares
every key at the final revision instead.

The store is the one 'engram serve' opens with the same configuration (flags,
ENGRAM_* variables, --config FILE); it must be empty or hold an unfinished
migration from the same source, which is resumed. Engram must not serve it
meanwhile.
`

// sourceFlags are etcdctl's flags for reaching the source.
type sourceFlags struct {
	from                  string
	cacert, cert, key     string
	insecureSkipTLSVerify bool
	user, password        string
	dialTimeout           time.Duration
}

func (s *sourceFlags) bind(fs *pflag.FlagSet, name, what string) {
	fs.StringVar(&s.from, name, "", what+": an etcd v3 endpoint, e.g. https://10.0.0.1:2379")
	fs.StringVar(&s.cacert, "cacert", "", "verify the source's certificate with this CA bundle")
	fs.StringVar(&s.cert, "cert", "", "client certificate for the source")
	fs.StringVar(&s.key, "key", "", "client key for the source")
	fs.BoolVar(&s.insecureSkipTLSVerify, "insecure-skip-tls-verify", false, "do not verify the source's certificate")
	fs.StringVar(&s.user, "user", "", "the source's user[:password]")
	fs.StringVar(&s.password, "password", "", "the source's password")
	fs.DurationVar(&s.dialTimeout, "dial-timeout", 5*time.Second, "bound of connecting to the source")
}

// client connects to an endpoint with etcdctl's TLS flags.
func (s *sourceFlags) client(endpoint string) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:          []string{endpoint},
		DialTimeout:        s.dialTimeout,
		Logger:             zap.NewNop(),
		MaxCallRecvMsgSize: 64 << 20,
	}
	if s.cacert != "" || s.cert != "" || s.insecureSkipTLSVerify || strings.HasPrefix(endpoint, "https://") {
		tc, err := clientTLS(s.cacert, s.cert, s.key, s.insecureSkipTLSVerify)
		if err != nil {
			return nil, err
		}
		if tc == nil {
			tc = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		cfg.TLS = tc
	}
	if s.user != "" {
		cfg.Username, cfg.Password = s.user, s.password
		if u, p, ok := strings.Cut(s.user, ":"); ok {
			cfg.Username, cfg.Password = u, p
		}
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", endpoint, err)
	}
	return c, nil
}

func migrateMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "verify" {
		return migrateVerify(args[1:], stdout, stderr)
	}
	// Registered first: a SIGUSR1 that arrives before the runtime knows
	// it is wanted is dropped.
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)
	var (
		src              sourceFlags
		prefix           string
		cutover, restart bool
		base             string
		idleTimeout      time.Duration
	)
	cfg, _, err := config.LoadCommand(args, stdout, &config.Command{
		Usage: migrateUsage,
		Flags: func(fs *pflag.FlagSet) {
			src.bind(fs, "from", "the source")
			fs.StringVar(&prefix, "prefix", "", "move only the keys under this prefix (e.g. /registry/events/); the store still resumes at the source's revision")
			fs.BoolVar(&cutover, "cutover", false, "the source's writers are stopped: catch up, verify and finish now")
			fs.BoolVar(&restart, "restart", false, "discard an unfinished migration in the store and start over")
			fs.StringVar(&base, "base", "auto", "how the base is copied: snapshot (every revision above the source's compaction), range (the live keys at one revision, no history below it), or auto (snapshot, range when the source serves none)")
			fs.DurationVar(&idleTimeout, "idle-timeout", 30*time.Second, "give up the base copy when the source sends nothing for this long")
		},
	})
	if errors.Is(err, config.ErrHelp) {
		return 0
	}
	if err == nil && src.from == "" {
		err = errors.New("--from is required")
	}
	var baseMode migrate.BaseMode
	if err == nil {
		baseMode, err = migrate.ParseBaseMode(base)
	}
	if err == nil && idleTimeout <= 0 {
		err = fmt.Errorf("--idle-timeout must be positive, not %s", idleTimeout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "engram migrate: %v\n\nRun 'engram migrate --help' for usage.\n", err)
		return 2
	}
	logger := newLogger(cfg.Log, stderr)
	cfg.WarnUnknownEnv(logger)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cut := make(chan struct{})
	if cutover {
		close(cut)
	} else {
		go func() {
			select {
			case <-usr1:
				logger.Info("SIGUSR1: cutting over")
				close(cut)
			case <-ctx.Done():
			}
		}()
	}

	client, err := src.client(src.from)
	if err != nil {
		fmt.Fprintf(stderr, "engram migrate: %v\n", err)
		return 1
	}
	defer client.Close()
	store, err := openStore(ctx, cfg, logger.With("component", "storage"), nil)
	if err != nil {
		fmt.Fprintf(stderr, "engram migrate: %v\n", err)
		return 1
	}
	tempDir, err := prepareTempDir(cfg.DataDir)
	if err == nil {
		defer os.RemoveAll(tempDir)
	}
	if err != nil {
		store.Close()
		fmt.Fprintf(stderr, "engram migrate: %v\n", err)
		return 1
	}
	bar := newProgressLine(stderr)
	res, err := migrate.Run(ctx, migrate.Options{
		Client:      client,
		Source:      src.from,
		Store:       store,
		Prefix:      []byte(prefix),
		Restart:     restart,
		TempDir:     tempDir,
		Base:        baseMode,
		IdleTimeout: idleTimeout,
		Logger:      logger,
		Progress:    bar.show,
		Following: func(from int64) {
			if !cutover {
				fmt.Fprintf(stderr, "engram migrate: following %s from revision %d. Once its writers are stopped, cut over with: kill -USR1 %d (or stop this with Ctrl-C and run it again with --cutover)\n", src.from, from, os.Getpid())
			}
		},
	}, cut)
	bar.done()
	if cerr := store.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("close store: %w", cerr)
	}
	switch {
	case err == nil:
		fmt.Fprintf(stdout, "migrated %s: the store resumes at revision %d (%s, compacted at %d); %s; cut-over took %s.\nStart 'engram serve' with this configuration and switch the clients to it.\n",
			src.from, res.Rev, describeBase(res), res.CompactRev, res.Verified, res.Drain.Round(time.Millisecond))
		return 0
	case ctx.Err() != nil:
		fmt.Fprintf(stdout, "stopped; the position is saved: run the same command again to resume (add --cutover once the source's writers are stopped)\n")
		return 0
	default:
		fmt.Fprintf(stderr, "engram migrate: %v\n", err)
		return 1
	}
}

// describeBase says how the base was copied and what history that kept.
func describeBase(res migrate.Result) string {
	if res.Base == migrate.BaseRange {
		return fmt.Sprintf("base read by Range at revision %d: each key's latest version, no history below it and no users or roles", res.BaseRev)
	}
	return fmt.Sprintf("base snapshot at %d: every revision above the source's compaction", res.BaseRev)
}

const verifyUsage = `Usage: engram migrate verify --from URL [--to URL] [--rev R] [--prefix P] [flags]

Compares the source (--from) with the migrated store at revision R (default:
the source's current revision): etcd's HashKV for the whole keyspace, or key
by key under --prefix or when the source serves no HashKV (kine); a
difference is reported with the first differing key.
The target is --to (a running Engram or etcd endpoint) or, without it, the
store the configuration names, opened read-only.
`

func migrateVerify(args []string, stdout, stderr io.Writer) int {
	var (
		src    sourceFlags
		to     string
		rev    int64
		prefix string
	)
	cfg, _, err := config.LoadCommand(args, stdout, &config.Command{
		Usage: verifyUsage,
		Flags: func(fs *pflag.FlagSet) {
			src.bind(fs, "from", "the source")
			fs.StringVar(&to, "to", "", "the target endpoint (default: the configured store, opened read-only)")
			fs.Int64Var(&rev, "rev", 0, "revision to compare (default: the source's current revision)")
			fs.StringVar(&prefix, "prefix", "", "compare only the keys under this prefix")
		},
	})
	if errors.Is(err, config.ErrHelp) {
		return 0
	}
	if err == nil && src.from == "" {
		err = errors.New("--from is required")
	}
	if err != nil {
		fmt.Fprintf(stderr, "engram migrate verify: %v\n\nRun 'engram migrate verify --help' for usage.\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	fail := func(err error) int {
		fmt.Fprintf(stderr, "engram migrate verify: %v\n", err)
		return 1
	}
	source, err := src.client(src.from)
	if err != nil {
		return fail(err)
	}
	defer source.Close()
	if rev == 0 {
		r, err := source.Get(ctx, "\x00", clientv3.WithCountOnly())
		if err != nil {
			return fail(fmt.Errorf("read the source's revision: %w", err))
		}
		rev = r.Header.Revision
	}
	var target migrate.Side
	if to != "" {
		c, err := src.client(to)
		if err != nil {
			return fail(err)
		}
		defer c.Close()
		target = migrate.Remote{Client: c}
	} else {
		logger := newLogger(cfg.Log, stderr)
		cfg.WarnUnknownEnv(logger)
		store, err := openStore(ctx, cfg, logger.With("component", "storage"), nil)
		if err != nil {
			return fail(err)
		}
		defer store.Close()
		local, err := migrate.OpenLocal(ctx, store, os.TempDir())
		if err != nil {
			return fail(err)
		}
		defer local.Close()
		target = local
	}
	msg, err := migrate.Verify(ctx, migrate.Remote{Client: source}, target, migrate.VerifyOptions{Rev: rev, Prefix: []byte(prefix)})
	if err != nil {
		return fail(err)
	}
	fmt.Fprintf(stdout, "ok: %s\n", msg)
	return 0
}

// progressLine shows a migration's progress: one line rewritten in place on
// a terminal, a line every 10 s otherwise (logs).
type progressLine struct {
	w     io.Writer
	tty   bool
	last  time.Time
	wrote bool
}

func newProgressLine(w io.Writer) *progressLine {
	tty := false
	if f, ok := w.(*os.File); ok {
		tty = isTerminal(f)
	}
	return &progressLine{w: w, tty: tty}
}

func (p *progressLine) show(pr migrate.Progress) {
	if !p.tty && time.Since(p.last) < 10*time.Second {
		return
	}
	p.last = time.Now()
	var line string
	if pr.Phase == "base" {
		line = fmt.Sprintf("migrate: base snapshot at revision %d: %d versions imported", pr.SourceRev, pr.Rows)
	} else {
		line = fmt.Sprintf("migrate: %s: applied revision %d of the source's %d (%d behind), %.0f revisions/s", pr.Phase, pr.Applied, pr.SourceRev, max(pr.SourceRev-pr.Applied, 0), pr.Rate)
	}
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		p.wrote = true
		return
	}
	fmt.Fprintln(p.w, line)
}

func (p *progressLine) done() {
	if p.wrote {
		fmt.Fprintln(p.w)
	}
}
