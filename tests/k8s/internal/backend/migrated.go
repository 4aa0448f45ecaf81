//go:build !etcdref

package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/migrate"
	"github.com/engramkv/engram/engines/badger"
	"github.com/engramkv/engram/internal/etcdtest"
)

// ENGRAM_K8S_BACKEND=migrated runs the suite on badger stores migrated from
// a real etcd 3.6 (internal/etcdtest; make etcd-tools builds it): one etcd
// per test process, loaded once with a compacted history under
// MigratedPrefix (see loadMigrationSource);
// every test migrates it (migrate.Run, cut over at once) into a fresh
// badger store and is served from there. So the whole suite runs on a store
// whose history, leases and revision clock came in through the import path,
// at a revision other than 1 and beside keys the suite did not write (it
// passes so on real etcd too).
//
// The etcd lives as long as the process: etcdtest has the kernel kill it
// when the process ends, and a reaper shell removes its data directory then.
const MigratedPrefix = "/migrated/"

var (
	migOnce   sync.Once
	migSource *etcdtest.Etcd
	migClient *clientv3.Client
	migErr    error
	// migReaper is the write end of the reaper's stdin, held open for the
	// life of the process (garbage-collecting it would close it).
	migReaper io.WriteCloser
)

// freshStoreOnly lists the tests that assert a fresh store's exact
// revision, which no store holding data can pass, etcd included.
var freshStoreOnly = map[string]string{
	"TestTooLargeResourceVersionErrorForWatchList": `expects the message "current: 1" of a store at revision 1`,
}

// openMigratedStore returns a badger store in t.TempDir() holding a
// completed migration of the shared etcd.
func openMigratedStore(t testing.TB) kv.Store {
	t.Helper()
	if why, ok := freshStoreOnly[t.Name()]; ok {
		t.Skipf("%s=migrated: the test %s; a migrated store is past it", BackendEnv, why)
	}
	if _, err := etcdtest.Find(); errors.Is(err, etcdtest.ErrNotInstalled) && os.Getenv("CI") == "" {
		t.Skipf("%s=migrated: %v", BackendEnv, err)
	}
	migOnce.Do(func() {
		// Set first: a Start that ends t (t.Fatal) leaves it for the
		// later tests.
		migErr = errors.New("the shared etcd did not start (see the first test's output)")
		migErr = startMigrationSource(t)
	})
	if migErr != nil {
		t.Fatalf("%s=migrated: %v", BackendEnv, migErr)
	}
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("opening badger: %v", err)
	}
	// Registered before the server's own cleanup, so it runs after the
	// server has stopped.
	t.Cleanup(func() {
		if err := st.Close(); err != nil && !errors.Is(err, kv.ErrClosed) {
			t.Errorf("closing badger: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cut := make(chan struct{})
	close(cut)
	if _, err := migrate.Run(ctx, migrate.Options{
		Client: migClient, Source: migSource.ClientURL, Store: st, TempDir: t.TempDir(),
		Logger: slog.New(slog.DiscardHandler),
	}, cut); err != nil {
		t.Fatalf("migrating %s: %v", migSource.ClientURL, err)
	}
	return st
}

// processTB is the first test's TB for starting the shared etcd, with its
// cleanups dropped: the etcd must outlive that test.
type processTB struct{ testing.TB }

func (processTB) Cleanup(func()) {}

// startMigrationSource starts the shared etcd and loads it.
func startMigrationSource(t testing.TB) error {
	dir, err := os.MkdirTemp("", "engram-k8s-migrated-")
	if err != nil {
		return err
	}
	if err := startReaper(dir); err != nil {
		_ = os.RemoveAll(dir)
		return err
	}
	migSource = etcdtest.Start(processTB{t}, etcdtest.Options{DataDir: filepath.Join(dir, "etcd")})
	migClient, err = clientv3.New(clientv3.Config{
		Endpoints:   []string{migSource.Endpoint},
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return loadMigrationSource(ctx, migClient)
}

// startReaper starts a shell that removes dir once this process has ended:
// its stdin reaches end of file when the process's end of the pipe closes,
// however the process ends; by then the kernel has killed etcd (etcdtest's
// Pdeathsig), and the second's wait lets it go before its files are removed.
func startReaper(dir string) error {
	cmd := exec.Command("/bin/sh", "-c", `read _; sleep 1; rm -rf "$1"`, "engram-k8s-reaper", dir)
	// Own process group: a ^C to the test must not kill the reaper.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	w, err := cmd.StdinPipe()
	if err != nil {
		return fmt.Errorf("reaper: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("reaper: %w", err)
	}
	migReaper = w
	return nil
}

// loadMigrationSource writes a history under MigratedPrefix: revision 2 is
// one transaction creating every key (sub revisions 0 to 59), some on
// leases, and the source is compacted there; above it come updates,
// multi-op transactions with deletes, a range delete and a lease revoked
// with its keys. The shape is what the suite tolerates: tests watch from
// resourceVersion 1 (start revision 2, so the compaction may not be above
// it) and expect resourceVersion 102 to be in the future (so the history
// stays well below 100 revisions). etcd fails those tests the same way on
// any other shape.
func loadMigrationSource(ctx context.Context, c *clientv3.Client) error {
	var leases [2]clientv3.LeaseID
	for i := range leases {
		l, err := c.Grant(ctx, 3600)
		if err != nil {
			return err
		}
		leases[i] = l.ID
	}
	key := func(i int) string { return fmt.Sprintf("%sk%03d", MigratedPrefix, i) }
	var create []clientv3.Op
	for i := range 60 {
		var opts []clientv3.OpOption
		if i%10 == 0 {
			opts = append(opts, clientv3.WithLease(leases[i%20/10]))
		}
		create = append(create, clientv3.OpPut(key(i), "v0", opts...))
	}
	r, err := c.Txn(ctx).Then(create...).Commit()
	if err != nil {
		return err
	}
	if _, err := c.Compact(ctx, r.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		return err
	}
	for i := range 20 {
		if _, err := c.Put(ctx, key(i), "v1"); err != nil {
			return err
		}
	}
	for i := 20; i < 45; i += 5 {
		if _, err := c.Txn(ctx).Then(
			clientv3.OpPut(key(i), "txn"), clientv3.OpPut(key(i+1), "txn", clientv3.WithLease(leases[0])), clientv3.OpDelete(key(i+2)),
		).Commit(); err != nil {
			return err
		}
	}
	if _, err := c.Delete(ctx, MigratedPrefix+"k05", clientv3.WithPrefix()); err != nil {
		return err
	}
	if _, err := c.Revoke(ctx, leases[1]); err != nil {
		return err
	}
	for i := 45; i < 50; i++ {
		if _, err := c.Delete(ctx, key(i)); err != nil {
			return err
		}
	}
	return nil
}
