package tikv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tikv/client-go/v2/util/codec"
)

// fakePD serves PD's region statistics API: it checks the request's path
// and bounds against want and answers answer (or status and body).
type fakePD struct {
	t                *testing.T
	start, end       []byte // raw keys the caller asks about
	status           int    // 0: 200 with answer
	body             string
	hits             atomic.Int64
	gotStart, gotEnd atomic.Value
}

// pdAnswer is a complete answer of PD (statistics.RegionStats) for three
// regions of 96, 96 and 3 MiB.
const pdAnswer = `{"count":3,"empty_count":0,"storage_size":195,"storage_keys":1234567,` +
	`"store_leader_count":{"1":3},"store_peer_count":{"1":3,"4":3,"5":3},` +
	`"store_leader_size":{"1":195},"store_leader_keys":{"1":1234567},` +
	`"store_peer_size":{"1":195,"4":195,"5":195},"store_peer_keys":{"1":1234567,"4":1234567,"5":1234567}}`

func (f *fakePD) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.hits.Add(1)
	if r.Method != http.MethodGet || r.URL.Path != "/pd/api/v1/stats/region" {
		f.t.Errorf("PD got %s %s", r.Method, r.URL.Path)
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query()
	f.gotStart.Store(q.Get("start_key"))
	f.gotEnd.Store(q.Get("end_key"))
	if f.status != 0 {
		w.WriteHeader(f.status)
		fmt.Fprint(w, f.body)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	fmt.Fprint(w, pdAnswer)
}

func startFakePD(t *testing.T, f *fakePD) string {
	t.Helper()
	f.t = t
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// deadEndpoint is a 127.0.0.1 port nobody listens on (any more).
func deadEndpoint(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// TestPDRegionStats: the request carries the range's bounds in TiKV's
// memcomparable encoding (as PD keys its regions), as raw bytes in the
// query, and the answer's MiB become bytes.
func TestPDRegionStats(t *testing.T) {
	pd := &fakePD{}
	src := newPDRegionStats([]string{startFakePD(t, pd)}, nil)
	// A binary prefix whose encoding has bytes that need escaping in a
	// URL and a pad group (8 bytes and more).
	start, end := []byte("engram/\x00\xff&=+ %x"), []byte("engram0")
	st, err := src.RegionStats(context.Background(), start, end)
	if err != nil {
		t.Fatal(err)
	}
	if want := (RegionStats{Bytes: 195 << 20, Keys: 1234567}); st != want {
		t.Errorf("RegionStats = %+v, want %+v", st, want)
	}
	if got, want := pd.gotStart.Load(), string(codec.EncodeBytes(nil, start)); got != want {
		t.Errorf("start_key = %q, want %q", got, want)
	}
	if got, want := pd.gotEnd.Load(), string(codec.EncodeBytes(nil, end)); got != want {
		t.Errorf("end_key = %q, want %q", got, want)
	}
}

// TestPDRegionStatsErrors: a PD that answers an error, or something that
// is not its statistics, is an error naming the endpoint and what PD said.
func TestPDRegionStatsErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pd     *fakePD
		inErrs []string
	}{
		{"not bootstrapped", &fakePD{status: 500, body: `"TiKV cluster not bootstrapped, please start TiKV first"` + "\n"},
			[]string{"500 Internal Server Error", ": TiKV cluster not bootstrapped, please start TiKV first"}},
		{"not found", &fakePD{status: 404, body: "404 page not found"}, []string{"404 Not Found: 404 page not found"}},
		{"not JSON", &fakePD{status: 200, body: "<html>"}, []string{"decode the answer"}},
		{"negative", &fakePD{status: 200, body: `{"storage_size":-1}`}, []string{"negative statistics"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep := startFakePD(t, tc.pd)
			_, err := newPDRegionStats([]string{ep}, nil).RegionStats(context.Background(), []byte("a"), []byte("b"))
			if err == nil {
				t.Fatal("no error")
			}
			for _, s := range append(tc.inErrs, ep+"/pd/api/v1/stats/region") {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
}

// TestPDRegionStatsEndpoints: endpoints that are down or answer errors are
// skipped for the next one; the one that answered is asked first next
// time; when none answers, the error names each.
func TestPDRegionStatsEndpoints(t *testing.T) {
	ctx := context.Background()
	dead := deadEndpoint(t)
	failing := &fakePD{status: 503, body: `"no leader"`}
	good := &fakePD{}
	failingEP, goodEP := startFakePD(t, failing), startFakePD(t, good)
	src := newPDRegionStats([]string{dead, "http://" + failingEP + "/", goodEP}, nil)
	for i := range 3 {
		if _, err := src.RegionStats(ctx, []byte("a"), []byte("b")); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if f, g := failing.hits.Load(), good.hits.Load(); f != 1 || g != 3 {
		t.Errorf("the failing PD was asked %d times, the good one %d; want 1 and 3", f, g)
	}

	_, err := newPDRegionStats([]string{dead, failingEP}, nil).RegionStats(ctx, []byte("a"), []byte("b"))
	if err == nil {
		t.Fatal("no error when no PD answers")
	}
	for _, s := range []string{dead, failingEP, "no leader"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

// TestPDRegionStatsHungEndpoint: a PD that accepts the request and never
// answers is given up after the per-endpoint timeout and the next one is
// asked, within the caller's budget.
func TestPDRegionStatsHungEndpoint(t *testing.T) {
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // until the client gives up
	}))
	t.Cleanup(hung.Close)
	good := &fakePD{}
	src := newPDRegionStats([]string{hung.URL, startFakePD(t, good)}, nil)
	// Short, so the test is quick; the good PD answers in well under it.
	src.attempt = 250 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	st, err := src.RegionStats(ctx, []byte("a"), []byte("b"))
	if err != nil || st.Bytes != 195<<20 {
		t.Fatalf("with the first PD hung: %+v, %v", st, err)
	}
}

// TestPDRegionStatsTLS: with the adaptor's TLS settings PD's API is
// reached over https, endpoints without a scheme included.
func TestPDRegionStatsTLS(t *testing.T) {
	pd := &fakePD{t: t}
	srv := httptest.NewUnstartedServer(pd)
	// The plaintext attempt below makes the server log its handshake
	// failure; that is the expected outcome, not news.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	ep := strings.TrimPrefix(srv.URL, "https://")
	st, err := newPDRegionStats([]string{ep}, &tls.Config{RootCAs: roots}).RegionStats(context.Background(), []byte("a"), []byte("b"))
	if err != nil || st.Bytes != 195<<20 {
		t.Fatalf("over TLS: %+v, %v", st, err)
	}
	if _, err := newPDRegionStats([]string{ep}, nil).RegionStats(context.Background(), []byte("a"), []byte("b")); err == nil {
		t.Error("plaintext to a TLS PD succeeded")
	}
}
