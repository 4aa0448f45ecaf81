package tikvserve

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/tikv/client-go/v2/util/codec"

	"github.com/engramkv/engram/engines/tikv"
)

// PD serves its HTTP API and its gRPC services on one port, its client
// URL, and the adaptor's Size reads the region statistics from that API
// (engines/tikv/pdstats.go). The fake does the same: each connection on
// the PD listener goes to gRPC when it opens with HTTP/2's client preface
// (gRPC clients speak HTTP/2 from the first byte) and to the HTTP API
// otherwise. Only the call the adaptor makes is served.

// regionStatsFunc gives the statistics of a range of raw TiKV keys; the
// mock cluster's RegionStats.
type regionStatsFunc func(ctx context.Context, start, end []byte) (tikv.RegionStats, error)

// pdHTTP is PD's HTTP API as far as the adaptor uses it.
func pdHTTP(stats regionStatsFunc) http.Handler {
	mux := http.NewServeMux()
	// PD sums the approximate sizes of the regions overlapping the range,
	// each in whole MiB and at least 1 MiB when not empty; the fake
	// rounds the exact total of the mock's storage up to whole MiB, so a
	// non-empty range reads at least 1 MiB too.
	mux.HandleFunc("GET /pd/api/v1/stats/region", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		start, err := decodeKey(q.Get("start_key"))
		if err != nil {
			http.Error(w, jsonString("start_key: "+err.Error()), http.StatusBadRequest)
			return
		}
		end, err := decodeKey(q.Get("end_key"))
		if err != nil {
			http.Error(w, jsonString("end_key: "+err.Error()), http.StatusBadRequest)
			return
		}
		st, err := stats(r.Context(), start, end)
		if err != nil {
			http.Error(w, jsonString(err.Error()), http.StatusInternalServerError)
			return
		}
		const mib = 1 << 20
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]int64{
			"storage_size": (st.Bytes + mib - 1) / mib,
			"storage_keys": st.Keys,
		})
	})
	return mux
}

// decodeKey undoes the memcomparable encoding PD's region keys (and so
// the query's bounds) are in; an empty key stays empty (unbounded).
func decodeKey(s string) ([]byte, error) {
	if s == "" {
		return nil, nil
	}
	rest, key, err := codec.DecodeBytes([]byte(s), nil)
	if err != nil {
		return nil, err
	}
	if len(rest) > 0 {
		return nil, fmt.Errorf("%d bytes after the encoded key", len(rest))
	}
	return key, nil
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// http2Preface is how every HTTP/2 client connection, gRPC's included,
// begins.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// splitListener hands the connections of one listener to gRPC or to the
// HTTP API by their first bytes.
type splitListener struct {
	l          net.Listener
	grpc, http *connQueue
}

func splitPD(l net.Listener) *splitListener {
	s := &splitListener{l: l, grpc: newConnQueue(l.Addr()), http: newConnQueue(l.Addr())}
	go s.run()
	return s
}

func (s *splitListener) run() {
	defer s.grpc.close()
	defer s.http.close()
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		go s.route(c)
	}
}

// route reads just enough of c to tell its protocol; a client that sends
// nothing for a while is dropped.
func (s *splitListener) route(c net.Conn) {
	br := bufio.NewReaderSize(c, len(http2Preface))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	head, err := br.Peek(len(http2Preface))
	_ = c.SetReadDeadline(time.Time{})
	conn := &peekedConn{Conn: c, r: br}
	switch {
	case err == nil && string(head) == http2Preface:
		s.grpc.put(conn)
	case len(head) > 0:
		s.http.put(conn)
	default:
		_ = c.Close()
	}
}

// close stops accepting; connections already handed over are their
// servers' to close.
func (s *splitListener) close() error { return s.l.Close() }

// peekedConn is a connection whose first bytes were read ahead.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// connQueue is a net.Listener fed by splitListener.
type connQueue struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newConnQueue(addr net.Addr) *connQueue {
	return &connQueue{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (q *connQueue) put(c net.Conn) {
	select {
	case q.conns <- c:
	case <-q.done:
		_ = c.Close()
	}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) close() { q.once.Do(func() { close(q.done) }) }

func (q *connQueue) Close() error { q.close(); return nil }

func (q *connQueue) Addr() net.Addr { return q.addr }

// serveHTTP serves PD's HTTP API on the split's HTTP side until stopped.
func (s *Server) serveHTTP(q *connQueue) *http.Server {
	srv := &http.Server{Handler: pdHTTP(s.regionStats), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(q); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			s.log.Warn("tikvserve: PD's HTTP API stopped", "err", err)
		}
	}()
	return srv
}
