package etcddiff

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// hangGuard bounds every wait for an answer. It is not a measurement: an
// answer that does not come within it is recorded as "no answer" and
// compared like any other, so a server that stays silent where etcd
// answers (or the reverse) shows as a difference instead of a hung test.
const hangGuard = 5 * time.Second

// server is the oracle or a target: raw gRPC clients, so that nothing
// retries, validates or hides an error on the way.
type server struct {
	name    string
	conn    *grpc.ClientConn
	kv      pb.KVClient
	lease   pb.LeaseClient
	watch   pb.WatchClient
	streams [nStreams]*stream
	ka      *kaStream
	// toOwn and toOracle map the server-chosen lease IDs, by grant order:
	// the oracle's ID to this server's and back.
	toOwn, toOracle map[int64]int64
	// diff is the first difference from the oracle; the target gets no
	// more requests after it (its state has split from the oracle's).
	diff   string
	agreed int
}

func dial(t testing.TB, name, endpoint string) *server {
	t.Helper()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatalf("%s: dial %s: %v", name, endpoint, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &server{
		name: name, conn: conn,
		kv: pb.NewKVClient(conn), lease: pb.NewLeaseClient(conn), watch: pb.NewWatchClient(conn),
		toOwn: map[int64]int64{}, toOracle: map[int64]int64{},
	}
}

func (s *server) lid(id int64) int64 {
	if own, ok := s.toOwn[id]; ok {
		return own
	}
	return id
}

// stream is one Watch stream; a goroutine receives into ch so that reads
// can give up at the hang guard.
type stream struct {
	c      pb.Watch_WatchClient
	ch     chan recvd[*pb.WatchResponse]
	active map[int64]bool // this server's own view of its watchers
}

type recvd[T any] struct {
	r   T
	err error
}

func recvLoop[T any](recv func() (T, error), ch chan<- recvd[T]) {
	for {
		r, err := recv()
		ch <- recvd[T]{r, err}
		if err != nil {
			return
		}
	}
}

func (s *server) stream(ctx context.Context, i int) (*stream, error) {
	if s.streams[i] != nil {
		return s.streams[i], nil
	}
	c, err := s.watch.Watch(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: opening watch stream %d: %w", s.name, i, err)
	}
	st := &stream{c: c, ch: make(chan recvd[*pb.WatchResponse], 1024), active: map[int64]bool{}}
	go recvLoop(c.Recv, st.ch)
	s.streams[i] = st
	return st, nil
}

// next returns the stream's next response, or nil after wait.
func (st *stream) next(wait time.Duration) (*pb.WatchResponse, error) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case r := <-st.ch:
		if r.err != nil {
			return nil, r.err
		}
		switch {
		case r.r.Canceled:
			delete(st.active, r.r.WatchId)
		case r.r.Created && r.r.WatchId >= 0:
			st.active[r.r.WatchId] = true
		}
		return r.r, nil
	case <-timer.C:
		return nil, nil
	}
}

type kaStream struct {
	c  pb.Lease_LeaseKeepAliveClient
	ch chan recvd[*pb.LeaseKeepAliveResponse]
}

// answer is a server's answer to one operation, raw (for the model) and
// as compared.
type answer struct {
	resp  any
	err   error
	watch []*pb.WatchResponse // a watch op's responses, or a sync's
	text  string
	// ttl is a lease's remaining TTL, compared apart from text.
	ttl    int64
	hasTTL bool
}

// exec sends o to s and returns its answer, not yet rendered.
func (s *server) exec(ctx context.Context, o *op) answer {
	req := o.build(s.lid)
	uctx, cancel := context.WithTimeout(ctx, hangGuard)
	defer cancel()
	var a answer
	switch r := req.(type) {
	case *pb.RangeRequest:
		a.resp, a.err = s.kv.Range(uctx, r)
	case *pb.PutRequest:
		a.resp, a.err = s.kv.Put(uctx, r)
	case *pb.DeleteRangeRequest:
		a.resp, a.err = s.kv.DeleteRange(uctx, r)
	case *pb.TxnRequest:
		a.resp, a.err = s.kv.Txn(uctx, r)
	case *pb.CompactionRequest:
		a.resp, a.err = s.kv.Compact(uctx, r)
	case *pb.LeaseGrantRequest:
		a.resp, a.err = s.lease.LeaseGrant(uctx, r)
	case *pb.LeaseRevokeRequest:
		a.resp, a.err = s.lease.LeaseRevoke(uctx, r)
	case *pb.LeaseTimeToLiveRequest:
		a.resp, a.err = s.lease.LeaseTimeToLive(uctx, r)
	case *pb.LeaseLeasesRequest:
		a.resp, a.err = s.lease.LeaseLeases(uctx, r)
	case *pb.LeaseKeepAliveRequest:
		a.resp, a.err = s.keepAlive(ctx, r)
	case *pb.WatchRequest:
		a.watch, a.err = s.watchOp(ctx, o, r)
	default:
		a.err = fmt.Errorf("etcddiff: no sender for %T", req)
	}
	return a
}

func (s *server) keepAlive(ctx context.Context, r *pb.LeaseKeepAliveRequest) (*pb.LeaseKeepAliveResponse, error) {
	if s.ka == nil {
		c, err := s.lease.LeaseKeepAlive(ctx)
		if err != nil {
			return nil, err
		}
		s.ka = &kaStream{c: c, ch: make(chan recvd[*pb.LeaseKeepAliveResponse], 16)}
		go recvLoop(c.Recv, s.ka.ch)
	}
	if err := s.ka.c.Send(r); err != nil {
		return nil, err
	}
	select {
	case got := <-s.ka.ch:
		return got.r, got.err
	case <-time.After(hangGuard):
		return nil, errNoAnswer
	}
}

var errNoAnswer = errors.New("no answer within the hang guard")

// watchOp sends a watch request and, for one etcd answers with a control
// response (created, refused, canceled), reads up to it: etcd sends those
// on a channel of their own, so they are read apart from the events and
// progress notifications the sync reads.
func (s *server) watchOp(ctx context.Context, o *op, r *pb.WatchRequest) ([]*pb.WatchResponse, error) {
	st, err := s.stream(ctx, o.stream)
	if err != nil {
		return nil, err
	}
	if err := st.c.Send(r); err != nil {
		return nil, err
	}
	if !o.ctrl {
		return nil, nil
	}
	var got []*pb.WatchResponse
	for {
		w, err := st.next(hangGuard)
		if err != nil {
			return got, err
		}
		if w == nil {
			return got, errNoAnswer
		}
		got = append(got, w)
		if w.Created || w.Canceled {
			return got, nil
		}
	}
}

// syncMode is how a stream is brought to a point where both servers have
// sent everything the operation caused.
type syncMode int

const (
	syncNone syncMode = iota
	// syncProgress: one progress request; etcd answers it (watch_id -1,
	// the current revision) after every event of the stream's watchers,
	// all synced, since the notification goes through the same channel
	// the events took, and the events of a write are in it before the
	// write returns.
	syncProgress
	// syncCatchUp: a watcher from a past revision is synced from the
	// history by etcd's background loop (every 100 ms), and etcd drops a
	// progress request while any watcher of the stream is unsynced
	// (watchable_store.go progressIfSync; the 3.6 server does not retry
	// it). So progress is requested again after each quiet catchUpGap
	// until one is answered. A watcher canceled by a compaction stays on
	// the stream and would block progress for good: it is canceled, as a
	// client does.
	syncCatchUp
	// syncAwait: the operation was itself a progress request; its answer
	// is the sync point.
	syncAwait
)

// catchUpGap is how long a catching-up stream may be quiet before the
// progress request is repeated; longer than etcd's 100 ms sync loop.
const catchUpGap = 150 * time.Millisecond

func isProgress(w *pb.WatchResponse) bool {
	return !w.Created && !w.Canceled && len(w.Events) == 0
}

// byWatcher orders a read's responses by watch ID, keeping each
// watcher's own order, control responses (created, canceled) after the
// events and the progress notification last: etcd hands a
// write's events to the watchers it concerns in map order
// (watchable_store.go notify over a watcherGroup), so the order across
// watchers is not etcd's to keep, and a second etcd differs in it.
func byWatcher(ws []*pb.WatchResponse) {
	rank := func(w *pb.WatchResponse) int64 {
		switch {
		case isProgress(w):
			return 1<<62 + 1
		case w.Created || w.Canceled:
			// A watch request's control response, read last; a
			// watcher's events come before its cancel either way.
			return 1 << 62
		}
		return w.WatchId
	}
	slices.SortStableFunc(ws, func(a, b *pb.WatchResponse) int { return cmp.Compare(rank(a), rank(b)) })
}

var progressRequest = &pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}}

// requestProgress sends a progress request on stream i.
func (s *server) requestProgress(ctx context.Context, i int) error {
	st, err := s.stream(ctx, i)
	if err != nil {
		return err
	}
	return st.c.Send(progressRequest)
}

// sync reads stream i's responses up to its sync point.
func (s *server) sync(ctx context.Context, i int, mode syncMode) ([]*pb.WatchResponse, error) {
	st, err := s.stream(ctx, i)
	if err != nil {
		return nil, err
	}
	progress := progressRequest
	var got []*pb.WatchResponse
	if mode == syncProgress || mode == syncAwait {
		if mode == syncProgress {
			if err := st.c.Send(progress); err != nil {
				return nil, err
			}
		}
		for {
			w, err := st.next(hangGuard)
			if err != nil {
				return got, err
			}
			if w == nil {
				return got, errNoAnswer
			}
			got = append(got, w)
			if isProgress(w) {
				return got, nil
			}
		}
	}
	for range int(hangGuard / catchUpGap) {
		if len(st.active) == 0 {
			return got, nil // nothing left to answer progress
		}
		if err := st.c.Send(progress); err != nil {
			return got, err
		}
		for {
			w, err := st.next(catchUpGap)
			if err != nil {
				return got, err
			}
			if w == nil {
				break // quiet: ask again
			}
			got = append(got, w)
			if isProgress(w) {
				return got, nil
			}
			if w.Canceled && w.CompactRevision != 0 {
				cancel := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: w.WatchId}}}
				if err := st.c.Send(cancel); err != nil {
					return got, err
				}
			}
		}
	}
	return got, errNoAnswer
}

// render normalises a's response in place and renders it: only the
// cluster ID, member ID and raft term (which no two clusters share) and
// server-chosen lease IDs (mapped to the oracle's by grant order) are
// normalised, and a lease's remaining TTL is taken out to be compared
// within a second (the servers receive the request at slightly different
// times, and etcd rounds the remaining time).
func (s *server) render(a *answer) {
	var b strings.Builder
	if a.err != nil {
		if st, ok := status.FromError(a.err); ok {
			fmt.Fprintf(&b, "error %s: %s", st.Code(), st.Message())
		} else {
			fmt.Fprintf(&b, "error %v", a.err)
		}
	}
	n := norm{s}
	if a.resp != nil && a.err == nil {
		n.resp(a.resp)
		if r, ok := a.resp.(*pb.LeaseTimeToLiveResponse); ok {
			a.ttl, a.hasTTL, r.TTL = r.TTL, true, 0
		}
		b.WriteString(fmt.Sprint(a.resp))
	}
	for _, w := range a.watch {
		n.resp(w)
		b.WriteString("\n    watch: " + clip(w.String(), 4000))
	}
	a.text = b.String()
}

type norm struct{ s *server }

func (n norm) id(id int64) int64 {
	if o, ok := n.s.toOracle[id]; ok {
		return o
	}
	return id
}

func (n norm) header(h *pb.ResponseHeader) {
	if h != nil {
		h.ClusterId, h.MemberId, h.RaftTerm = 0, 0, 0
	}
}

func (n norm) kvs(kvs ...*mvccpb.KeyValue) {
	for _, kv := range kvs {
		if kv != nil {
			kv.Lease = n.id(kv.Lease)
		}
	}
}

func (n norm) resp(r any) {
	switch r := r.(type) {
	case *pb.RangeResponse:
		n.header(r.Header)
		n.kvs(r.Kvs...)
	case *pb.PutResponse:
		n.header(r.Header)
		n.kvs(r.PrevKv)
	case *pb.DeleteRangeResponse:
		n.header(r.Header)
		n.kvs(r.PrevKvs...)
	case *pb.TxnResponse:
		n.header(r.Header)
		for _, op := range r.Responses {
			switch x := op.Response.(type) {
			case *pb.ResponseOp_ResponseRange:
				n.resp(x.ResponseRange)
			case *pb.ResponseOp_ResponsePut:
				n.resp(x.ResponsePut)
			case *pb.ResponseOp_ResponseDeleteRange:
				n.resp(x.ResponseDeleteRange)
			case *pb.ResponseOp_ResponseTxn:
				n.resp(x.ResponseTxn)
			}
		}
	case *pb.CompactionResponse:
		n.header(r.Header)
	case *pb.LeaseGrantResponse:
		n.header(r.Header)
		r.ID = n.id(r.ID)
	case *pb.LeaseRevokeResponse:
		n.header(r.Header)
	case *pb.LeaseTimeToLiveResponse:
		n.header(r.Header)
		r.ID = n.id(r.ID)
		// etcd lists a lease's keys from a map (lease/lease.go Keys), in
		// no order of its own: two etcds differ in it.
		slices.SortFunc(r.Keys, bytes.Compare)
	case *pb.LeaseLeasesResponse:
		n.header(r.Header)
		for _, l := range r.Leases {
			l.ID = n.id(l.ID)
		}
	case *pb.LeaseKeepAliveResponse:
		n.header(r.Header)
		r.ID = n.id(r.ID)
	case *pb.WatchResponse:
		n.header(r.Header)
		for _, ev := range r.Events {
			n.kvs(ev.Kv, ev.PrevKv)
		}
	}
}

// same reports whether a target's answer equals the oracle's.
func same(oracle, target answer) bool {
	if oracle.text != target.text || oracle.hasTTL != target.hasTTL {
		return false
	}
	d := oracle.ttl - target.ttl
	return !oracle.hasTTL || (d >= -1 && d <= 1)
}
