// Package kinetest starts throwaway kine servers (k3s's etcd shim,
// github.com/k3s-io/kine) on a throwaway PostgreSQL for tests: the
// migration's tests copy a kine into Engram as k3s users would.
//
// It owns finding the kine binary that `make bin/kine` builds from the
// wrapper module bench/kine (kine's own entry point, unchanged), creating a
// database for it on an internal/pgtest server, starting it on 127.0.0.1 at
// a port chosen at run time, waiting until it answers, and stopping it when
// the test ends. Starting PostgreSQL is internal/pgtest's; running the
// process is internal/proctest's.
//
// It must stay a test helper with no dependencies beyond the standard
// library and the repository's other test helpers (kine is a separate
// process, never linked into Engram's module), and must never touch a kine
// or a database it did not start.
package kinetest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/engramkv/engram/internal/etcdtest"
	"github.com/engramkv/engram/internal/pgtest"
	"github.com/engramkv/engram/internal/proctest"
)

// BinEnv names the environment variable that points at the kine binary,
// overriding <repo root>/bin/kine.
const BinEnv = "ENGRAM_KINE_BIN"

// ErrNotBuilt is returned when the kine binary is missing.
var ErrNotBuilt = errors.New("kinetest: bin/kine not built (make bin/kine, or set " + BinEnv + ")")

// Kine is a running kine.
type Kine struct {
	// Endpoint is kine's etcd endpoint, "http://127.0.0.1:PORT".
	Endpoint string
	// Database names kine's database on the PostgreSQL server.
	Database string
	proc     *proctest.Proc
}

// Options change how a kine runs.
type Options struct {
	// Args are more kine flags, e.g. "--compact-interval=0s".
	Args []string
}

var databases atomic.Int64

// Start starts a kine on a database of its own on pg for t and stops it
// at t.Cleanup. A missing kine binary skips t, unless the environment
// variable CI is set, where it fails t.
func Start(t testing.TB, pg *pgtest.Server, opts Options) *Kine {
	t.Helper()
	return proctest.StartFor(t, "kine", func() (*Kine, error) { return Launch(pg, opts) }, ErrNotBuilt)
}

// Launch starts a kine that the caller stops with Stop.
func Launch(pg *pgtest.Server, opts Options) (*Kine, error) {
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	db := fmt.Sprintf("kine_%d_%d", os.Getpid(), databases.Add(1))
	if out, err := pg.Exec("", "CREATE DATABASE "+db); err != nil {
		return nil, fmt.Errorf("kinetest: create database %s: %w: %s", db, err, out)
	}
	return proctest.Retry(3, func() (*Kine, error) { return launch(bin, pg, db, opts) })
}

func launch(bin string, pg *pgtest.Server, db string, opts Options) (*Kine, error) {
	ports := make([]int, 2)
	for i := range ports {
		p, err := proctest.FreePort()
		if err != nil {
			return nil, fmt.Errorf("kinetest: %w", err)
		}
		ports[i] = p
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	dir, err := os.MkdirTemp("", "engram-kine-")
	if err != nil {
		return nil, fmt.Errorf("kinetest: %w", err)
	}
	args := append([]string{"--endpoint=" + pg.URL(db), "--listen-address=" + addr,
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", ports[1])}, opts.Args...)
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	proc, err := proctest.Start("kine", cmd, dir, syscall.SIGTERM, nil)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("kinetest: %w", err)
	}
	k := &Kine{Endpoint: "http://" + addr, Database: db, proc: proc}
	// kine listens once its database schema is in place.
	err = proc.WaitReady(30*time.Second, func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
	if err != nil {
		_ = proc.Stop()
		return nil, fmt.Errorf("kinetest: %w", err)
	}
	return k, nil
}

// Log returns what kine has printed so far (its tail).
func (k *Kine) Log() string { return k.proc.Log() }

// Stop stops kine. It is safe to call more than once.
func (k *Kine) Stop() error { return k.proc.Stop() }

func findBin() (string, error) {
	if p := os.Getenv(BinEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("kinetest: %s=%s: %w", BinEnv, p, err)
		}
		return p, nil
	}
	root, err := etcdtest.RepoRoot()
	if err != nil {
		return "", err
	}
	p := filepath.Join(root, "bin", "kine")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%w: %v", ErrNotBuilt, err)
	}
	return p, nil
}
