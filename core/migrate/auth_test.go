package migrate_test

import (
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/engramkv/engram/core/migrate"
	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/internal/etcdtest"
)

// TestMigrateCarriesAuth: a source with auth on is migrated by a client
// logged in as root (Snapshot needs root). The target has the source's
// users, passwords, roles and enable switch from the base snapshot, so a
// restricted user gets the same answers from both; a user the source gains
// after the base is not followed (etcd's watch carries no auth change), and
// the cut-over warns about it instead of passing it over in silence.
func TestMigrateCarriesAuth(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	e := etcdtest.Start(t, etcdtest.Options{Args: []string{"--bcrypt-cost=4"}})
	for _, s := range [][]string{
		{"user", "add", "root", "--new-user-password=rp"},
		{"user", "add", "alice", "--new-user-password=ap"},
		{"role", "add", "reader"},
		{"role", "grant-permission", "reader", "read", "/app/", "--prefix"},
		{"user", "grant-role", "alice", "reader"},
		{"user", "grant-role", "root", "root"},
		{"put", "/app/x", "1"},
		{"put", "/other", "2"},
		{"auth", "enable"},
	} {
		if out, err := e.Etcdctl(t, s...); err != nil {
			t.Fatalf("etcdctl %v: %v\n%s", s, err, out)
		}
	}
	src, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, Username: "root", Password: "rp", DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })

	st := openBadger(t, "")
	var logs logBuffer
	following := make(chan int64, 1)
	cutover := make(chan struct{})
	ch := runAsync(ctx, migrate.Options{Client: src, Source: e.ClientURL, Store: st, TempDir: t.TempDir(), Logger: logs.logger(),
		Following: func(from int64) {
			select {
			case following <- from:
			default:
			}
		}}, cutover)
	select {
	case <-following:
	case <-ctx.Done():
		t.Fatalf("the migration never followed the source: %v", ctx.Err())
	}
	if out, err := e.Etcdctl(t, "--user=root:rp", "user", "add", "dave", "--new-user-password=dp"); err != nil {
		t.Fatalf("adding a user after the base: %v\n%s", err, out)
	}
	close(cutover)
	if r := waitRun(t, ch, time.Minute); r.err != nil {
		t.Fatalf("migrate: %v\n%s", r.err, logs.String())
	}
	if !strings.Contains(logs.String(), "changed on the source after the base snapshot") {
		t.Errorf("no warning about the user added after the base:\n%s", logs.String())
	}

	srv := servertest.Start(t, st, servertest.Options{Auth: server.AuthOptions{BcryptCost: 4}})
	for _, c := range [][]string{
		{"--user=alice:ap", "get", "/app/x", "--print-value-only"},
		{"--user=alice:ap", "get", "/other"},
		{"--user=alice:wrong", "get", "/app/x"},
		{"get", "/app/x"},
		{"--user=root:rp", "role", "get", "reader"},
	} {
		want, werr := e.Etcdctl(t, c...)
		got, gerr := etcdtest.Etcdctl(t, append([]string{"--endpoints=" + srv.Endpoint}, c...)...)
		if want != got || (werr == nil) != (gerr == nil) {
			t.Errorf("etcdctl %v:\n  source: %s %v\n  target: %s %v", c, want, werr, got, gerr)
		}
	}
	if out, _ := etcdtest.Etcdctl(t, "--endpoints="+srv.Endpoint, "--user=root:rp", "user", "list"); strings.Contains(out, "dave") || !strings.Contains(out, "alice") {
		t.Errorf("target's users, as of the base snapshot, want alice and no dave:\n%s", out)
	}
}
