package tikv_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pingcap/kvproto/pkg/kvrpcpb"
	tikvclient "github.com/tikv/client-go/v2/tikv"
	"github.com/tikv/client-go/v2/tikvrpc"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/tikv"
	"github.com/engramkv/engram/engines/tikv/tikvmock"
)

func scanKeys(t *testing.T, s kv.Store, opts kv.ScanOptions) []string {
	t.Helper()
	ctx := context.Background()
	it, err := s.Scan(ctx, opts)
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	defer it.Close()
	var keys []string
	for {
		b, err := it.Next(ctx)
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		if len(b) == 0 {
			return keys
		}
		for _, p := range b {
			keys = append(keys, string(p.Key))
		}
	}
}

// TestPartitionsFollowRegions checks that Partitions cuts a range exactly
// at the region boundaries inside it, in user keys.
func TestPartitionsFollowRegions(t *testing.T) {
	s := openMock(t, tikvmock.Options{Splits: []string{"b", "d", "f"}})
	defer s.Close()
	if !s.Features().Partitions {
		t.Fatal("Features().Partitions = false")
	}
	ctx := context.Background()
	for _, tc := range []struct {
		start, end string
		want       []string // boundaries
	}{
		{"", "", []string{"b", "d", "f"}},
		{"a", "e", []string{"b", "d"}},
		{"b", "d", nil},
		{"c", "", []string{"d", "f"}},
		{"g", "z", nil},
	} {
		parts, err := s.Partitions(ctx, []byte(tc.start), []byte(tc.end))
		if err != nil {
			t.Fatalf("Partitions(%q, %q): %v", tc.start, tc.end, err)
		}
		var got []string
		for i, p := range parts {
			if i > 0 {
				got = append(got, string(p.Start))
			}
		}
		if strings.Join(got, ",") != strings.Join(tc.want, ",") || string(parts[0].Start) != tc.start || string(parts[len(parts)-1].End) != tc.end {
			t.Errorf("Partitions(%q, %q) = %q, want boundaries %q", tc.start, tc.end, parts, tc.want)
		}
	}
}

// TestPrefixIsolation runs two stores with different prefixes on one
// cluster: neither sees, scans, conflicts with or partitions over the
// other's keys, even at the edges of the keyspace.
func TestPrefixIsolation(t *testing.T) {
	c, err := tikvmock.NewCluster([]byte("a/m"), []byte("b/m"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	open := func(prefix string) *tikv.Store {
		s, err := c.Open(tikv.Options{Prefix: []byte(prefix)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a, b := open("a/"), open("b/")
	ctx := context.Background()
	for _, s := range []*tikv.Store{a, b} {
		ops := []kv.Op{kv.PutIfAbsent([]byte{0x00}, []byte("lo")), kv.PutIfAbsent([]byte{0xFF, 0xFF}, []byte("hi")), kv.PutIfAbsent([]byte("m"), []byte("mid"))}
		if err := s.Commit(ctx, ops); err != nil {
			t.Fatalf("Commit: %v", err)
		}
	}
	if err := a.Commit(ctx, []kv.Op{kv.Put([]byte("only-a"), []byte("x"))}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, []byte("only-a")); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("b sees a's key: %v", err)
	}
	want := "\x00,m,\xff\xff"
	for name, s := range map[string]*tikv.Store{"b": b} {
		if got := strings.Join(scanKeys(t, s, kv.ScanOptions{}), ","); got != want {
			t.Errorf("%s: full scan = %q, want %q", name, got, want)
		}
		if got := strings.Join(scanKeys(t, s, kv.ScanOptions{Reverse: true}), ","); got != "\xff\xff,m,\x00" {
			t.Errorf("%s: full reverse scan = %q", name, got)
		}
	}
	if got := strings.Join(scanKeys(t, a, kv.ScanOptions{Reverse: true}), ","); got != "\xff\xff,only-a,m,\x00" {
		t.Errorf("a: full reverse scan = %q", got)
	}
	// b's region boundary "b/m" becomes the user key "m"; a's is not
	// in b's namespace.
	parts, err := b.Partitions(ctx, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 2 || string(parts[0].End) != "m" || len(parts[1].End) != 0 {
		t.Errorf("b.Partitions = %q, want a split at \"m\" only", parts)
	}
}

// TestLargeScanResizes scans values of mixed sizes, forward and reverse,
// with small and large batches: the adaptor changes its TiKV request size
// as it goes, and must neither skip nor repeat a pair when it does. Over a
// range of large values alike, no TiKV response may exceed TiKV's default
// gRPC message limit.
func TestLargeScanResizes(t *testing.T) {
	var maxResp atomic.Int64
	s := openMock(t, tikvmock.Options{Hijack: func(c tikvclient.Client) tikvclient.Client {
		return &sizeMeter{Client: c, max: &maxResp}
	}})
	defer s.Close()
	ctx := context.Background()
	var want []string
	for i := range 100 {
		size := 10
		if i/20%2 == 1 {
			size = 512 << 10 // runs of large values between runs of small ones
		}
		k := fmt.Sprintf("r/%04d", i)
		if err := s.Commit(ctx, []kv.Op{kv.Put([]byte(k), bytes.Repeat([]byte{byte(i)}, size))}); err != nil {
			t.Fatal(err)
		}
		want = append(want, k)
	}
	for _, rev := range []bool{false, true} {
		for _, bs := range []int{1, 1000} {
			got := scanKeys(t, s, kv.ScanOptions{Start: []byte("r/"), End: []byte("r0"), Reverse: rev, BatchSize: bs})
			w := want
			if rev {
				w = make([]string, len(want))
				for i, k := range want {
					w[len(want)-1-i] = k
				}
			}
			if strings.Join(got, ",") != strings.Join(w, ",") {
				t.Errorf("reverse=%v batch=%d: %d keys, want %d in order", rev, bs, len(got), len(w))
			}
		}
	}
	// Only large values: every response stays under 10 MiB.
	maxResp.Store(0)
	for _, rev := range []bool{false, true} {
		if got := scanKeys(t, s, kv.ScanOptions{Start: []byte("r/0020"), End: []byte("r/0040"), Reverse: rev}); len(got) != 20 {
			t.Errorf("reverse=%v: %d keys, want 20", rev, len(got))
		}
	}
	if m := maxResp.Load(); m > 10<<20 {
		t.Errorf("largest scan response %d bytes, over TiKV's default 10 MiB gRPC limit", m)
	}
}

// sizeMeter records the largest scan response.
type sizeMeter struct {
	tikvclient.Client
	max *atomic.Int64
}

func (c *sizeMeter) SendRequest(ctx context.Context, addr string, req *tikvrpc.Request, timeout time.Duration) (*tikvrpc.Response, error) {
	resp, err := c.Client.SendRequest(ctx, addr, req, timeout)
	if err == nil && req.Type == tikvrpc.CmdScan {
		if sr, ok := resp.Resp.(*kvrpcpb.ScanResponse); ok {
			n := int64(sr.Size())
			for old := c.max.Load(); n > old && !c.max.CompareAndSwap(old, n); old = c.max.Load() {
			}
		}
	}
	return resp, err
}

func TestOpenValidates(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		opts tikv.Options
		want string
	}{
		{"no endpoints", tikv.Options{Prefix: []byte("p/")}, "no PD endpoints"},
		{"no prefix", tikv.Options{PDEndpoints: []string{"127.0.0.1:1"}}, "prefix"},
		{"prefix without end", tikv.Options{PDEndpoints: []string{"127.0.0.1:1"}, Prefix: []byte{0xFF}}, "no end"},
		{"cert without key", tikv.Options{PDEndpoints: []string{"127.0.0.1:1"}, Prefix: []byte("p/"), TLS: tikv.TLSOptions{CAFile: "ca", CertFile: "c"}}, "together"},
		{"cert without CA", tikv.Options{PDEndpoints: []string{"127.0.0.1:1"}, Prefix: []byte("p/"), TLS: tikv.TLSOptions{CertFile: "c", KeyFile: "k"}}, "CA"},
	} {
		if _, err := tikv.Open(ctx, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Open = %v, want an error about %q", tc.name, err, tc.want)
		}
	}
}

// TestOpenUnreachable: with no PD listening, Open gives up after
// DialTimeout instead of retrying for minutes.
func TestOpenUnreachable(t *testing.T) {
	start := time.Now()
	_, err := tikv.Open(context.Background(), tikv.Options{
		PDEndpoints: []string{"127.0.0.1:1"},
		Prefix:      []byte("p/"),
		DialTimeout: 300 * time.Millisecond,
	})
	if err == nil {
		t.Fatal("Open of an unreachable PD succeeded")
	}
	// Ten seconds is some thirty DialTimeouts: the bound tells giving up
	// from retrying for minutes with room for a loaded machine.
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Open took %v to fail, want about the 300ms DialTimeout", d)
	}
	t.Logf("Open failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
}
