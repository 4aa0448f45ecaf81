package etcdapi

import (
	"bytes"
	"context"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/internal/watch"
)

type watchServer struct {
	pb.UnimplementedWatchServer
	s *Services
}

// Watch serves one bidirectional watch stream: many watchers sending on it
// one at a time. Each watcher's loop sends its own responses, so a slow
// client slows only its own stream.
func (w *watchServer) Watch(stream pb.Watch_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	select {
	case <-w.s.draining:
		return rpctypes.ErrGRPCStopped
	default:
	}
	role := w.s.current()
	go func() {
		select {
		case <-w.s.draining:
			cancel()
		case <-role.ended:
			cancel()
		case <-ctx.Done():
		}
	}()
	if !role.leading() {
		if role.Leader == nil {
			return noLeader
		}
		return w.drained(role, forwardStream(ctx, role, pb.NewWatchClient, pb.WatchClient.Watch, stream.Recv, stream.Send))
	}
	ws := &watchStream{s: w.s, hub: role.Hub, ctx: ctx, endStream: cancel, stream: stream,
		sendSlot: make(chan struct{}, 1), sendErr: make(chan error, 1), watchers: map[int64]*watch.Watcher{}, compacted: map[int64]struct{}{}, starts: map[int64]int64{}}
	defer ws.stopAll()
	sendErr := ws.sendErr
	recvErr := make(chan error, 1)
	go func() { recvErr <- ws.recvLoop(stream) }()
	select {
	case err := <-sendErr:
		return w.drained(role, err)
	case err := <-recvErr:
		if err != nil {
			return w.drained(role, err)
		}
		// The client closed its sending side; keep delivering until it
		// goes away, as etcd does.
		select {
		case err := <-sendErr:
			return w.drained(role, err)
		case <-ctx.Done():
			return w.drained(role, nil)
		}
	case <-ctx.Done():
		return w.drained(role, nil)
	}
}

// drained turns the end of a stream by Drain or by a change of role into an
// error the client retries ("server stopped", "leader changed"), so it
// re-watches from its last revision instead of seeing a clean end.
func (w *watchServer) drained(role *Role, err error) error {
	select {
	case <-w.s.draining:
		return rpctypes.ErrGRPCStopped
	case <-role.ended:
		return rpctypes.ErrGRPCLeaderChanged
	default:
		return err
	}
}

type watchStream struct {
	s         *Services
	hub       *watch.Hub
	ctx       context.Context
	endStream context.CancelFunc
	stream    pb.Watch_WatchServer
	// sendSlot admits one Send at a time (gRPC allows no concurrent
	// SendMsg on a stream). Watchers send themselves rather than through
	// a sender goroutine: an event then reaches the transport without a
	// second goroutine hand-off per watcher, which with 100 watchers on a
	// key range was most of the delivery latency's tail.
	sendSlot chan struct{}
	// sendErr receives the first failed Send, which ends the stream.
	sendErr chan error

	mu       sync.Mutex
	watchers map[int64]*watch.Watcher
	// compacted holds the IDs of watchers a compaction cancelled. As in
	// etcd, such a watcher stays on the stream until the client cancels
	// it: its ID stays taken, and no RequestProgress is answered while
	// it is there.
	compacted map[int64]struct{}
	// starts holds the start revision each watcher's client asked for
	// (none when it asked for 0): etcd answers no RequestProgress while the
	// store is below any of them.
	starts map[int64]int64
	nextID int64
	// progressTarget > 0 is a pending RequestProgress: it is answered once
	// every watcher delivered everything up to at least this revision.
	progressTarget int64
}

// send writes resp to the stream once no other send is in progress; it
// gives up waiting when ctx (a watcher's or the stream's) ends. Responses of
// one watcher keep their order because each watcher sends from its own loop.
func (ws *watchStream) send(ctx context.Context, resp *pb.WatchResponse) error {
	select {
	case ws.sendSlot <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-ws.ctx.Done():
		return ws.ctx.Err()
	}
	defer func() { <-ws.sendSlot }()
	if err := ws.ctx.Err(); err != nil {
		return err // the stream is ending: the handler may have returned
	}
	if err := ws.stream.Send(resp); err != nil {
		select {
		case ws.sendErr <- err:
		default:
		}
		ws.endStream()
		return err
	}
	return nil
}

func (ws *watchStream) recvLoop(stream pb.Watch_WatchServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return recvEnd(err)
		}
		switch r := req.RequestUnion.(type) {
		case *pb.WatchRequest_CreateRequest:
			if err := ws.create(r.CreateRequest); err != nil {
				return err
			}
		case *pb.WatchRequest_CancelRequest:
			if err := ws.cancel(r.CancelRequest.WatchId); err != nil {
				return err
			}
		case *pb.WatchRequest_ProgressRequest:
			ws.requestProgress()
		}
	}
}

func (ws *watchStream) create(cr *pb.WatchCreateRequest) error {
	if len(cr.Key) == 0 {
		// etcd treats an empty key as "\x00", the smallest key.
		cr.Key = []byte{0}
	}
	req := watch.Request{Key: cr.Key, End: cr.RangeEnd, StartRevision: cr.StartRevision, PrevKV: cr.PrevKv, ProgressNotify: cr.ProgressNotify}
	for _, f := range cr.Filters {
		switch f {
		case pb.WatchCreateRequest_NOPUT:
			req.NoPut = true
		case pb.WatchCreateRequest_NODELETE:
			req.NoDelete = true
		}
	}
	head := ws.hub.Head()
	// etcd refuses these watches as created and canceled at once, under
	// watch ID -1, and a refusal takes no ID from the stream.
	refuse := func(reason string) error {
		return ws.send(ws.ctx, &pb.WatchResponse{Header: ws.s.header(head), WatchId: -1, Created: true, Canceled: true, CancelReason: reason})
	}
	// etcd judges a negative start revision before anything else about
	// the request.
	if req.StartRevision < 0 {
		return refuse(rpctypes.ErrCompacted.Error())
	}
	if reason := ws.s.watchRefusal(ws.ctx, cr); reason != "" {
		return refuse(reason)
	}
	if err := ws.s.limits.checkKey(cr.Key); err != nil {
		// Engram's own key limit (etcd has none) is refused the same
		// way: under the client's own ID, the refusal could be taken
		// for the end of a running watcher holding that ID.
		return refuse(status.Convert(err).Message())
	}
	fromKey := len(cr.RangeEnd) == 1 && cr.RangeEnd[0] == 0
	if len(cr.RangeEnd) != 0 && !fromKey && bytes.Compare(cr.Key, cr.RangeEnd) >= 0 {
		return refuse("mvcc: watcher range is empty")
	}
	if req.StartRevision == 0 {
		req.StartRevision = head + 1
	}
	ws.mu.Lock()
	if cr.WatchId != 0 {
		if ws.taken(cr.WatchId) {
			ws.mu.Unlock()
			return refuse("mvcc: duplicate watch ID provided on the WatchStream")
		}
		req.ID = cr.WatchId
	} else {
		for ws.taken(ws.nextID) {
			ws.nextID++
		}
		req.ID = ws.nextID
		ws.nextID++
	}
	// Reserve the ID before the created response so events cannot precede
	// it and a concurrent create cannot take it.
	ws.watchers[req.ID] = nil
	if cr.StartRevision > 0 {
		ws.starts[req.ID] = cr.StartRevision
	}
	ws.mu.Unlock()
	if err := ws.send(ws.ctx, &pb.WatchResponse{Header: ws.s.header(head), WatchId: req.ID, Created: true}); err != nil {
		return err
	}
	w, err := ws.hub.Watch(ws.ctx, req, ws.sink, ws.checkProgress)
	if err != nil {
		ws.mu.Lock()
		delete(ws.watchers, req.ID)
		delete(ws.starts, req.ID)
		ws.mu.Unlock()
		return ws.send(ws.ctx, &pb.WatchResponse{Header: ws.s.header(head), WatchId: req.ID, Canceled: true, CancelReason: "engram: server is shutting down"})
	}
	ws.mu.Lock()
	if _, ok := ws.watchers[req.ID]; ok {
		ws.watchers[req.ID] = w
	}
	ws.mu.Unlock()
	// A watcher that starts synced never advances, so a progress request
	// that waited for it must be re-checked now.
	ws.checkProgress()
	return nil
}

// taken reports whether id names a watcher on the stream. Call with mu held.
func (ws *watchStream) taken(id int64) bool {
	_, running := ws.watchers[id]
	_, compacted := ws.compacted[id]
	return running || compacted
}

// sink turns the hub's responses into etcd watch responses.
func (ws *watchStream) sink(ctx context.Context, r watch.Response) error {
	resp := &pb.WatchResponse{
		Header:          ws.s.header(r.Revision),
		WatchId:         r.WatchID,
		Events:          r.Events,
		Canceled:        r.Canceled,
		CompactRevision: r.CompactRevision,
		CancelReason:    r.Reason,
	}
	if r.CompactRevision != 0 {
		// etcd's cancel for a compacted start carries revision 0 in its
		// header: it answers from no revision of the store.
		resp.Header = ws.s.header(0)
	}
	if r.Canceled {
		ws.mu.Lock()
		delete(ws.watchers, r.WatchID)
		delete(ws.starts, r.WatchID)
		if r.CompactRevision != 0 {
			ws.compacted[r.WatchID] = struct{}{}
		}
		ws.mu.Unlock()
		defer ws.checkProgress()
	}
	return ws.send(ctx, resp)
}

func (ws *watchStream) cancel(id int64) error {
	ws.mu.Lock()
	w, ok := ws.watchers[id]
	delete(ws.watchers, id)
	delete(ws.starts, id)
	if _, compacted := ws.compacted[id]; compacted {
		// etcd confirms the cancel of a watcher compaction ended.
		delete(ws.compacted, id)
		ok = true
	}
	ws.mu.Unlock()
	if !ok {
		// etcd answers a cancel of an unknown watch with nothing.
		return nil
	}
	if w != nil {
		w.Stop()
	}
	if err := ws.send(ws.ctx, &pb.WatchResponse{Header: ws.s.header(ws.hub.Head()), WatchId: id, Canceled: true}); err != nil {
		return err
	}
	ws.checkProgress()
	return nil
}

// requestProgress answers a RequestProgress once all watchers of the stream
// are synced, with watch ID -1, as etcd >= 3.5.13 does.
//
// On a stream without watchers etcd drops the request. While a watcher a
// compaction cancelled is still on the stream, etcd drops it too: it
// answers only when every watcher is in its synced group, and a compacted
// one is in none until the client cancels it (mvcc/watchable_store.go
// progressIfSync). A request made meanwhile is never answered, even after
// that cancel. etcd drops a request made
// while any watcher is catching up too; Engram instead answers it once
// the watchers caught up, because its watchers count as caught up only
// once their events are sent, which under steady writes could otherwise
// starve progress answers (README, compatibility).
func (ws *watchStream) requestProgress() {
	target := ws.hub.Head()
	ws.mu.Lock()
	if ws.dropProgress() || ws.waitsForStart(target) {
		ws.mu.Unlock()
		return
	}
	if ws.progressTarget == 0 || target > ws.progressTarget {
		ws.progressTarget = target
	}
	ws.mu.Unlock()
	ws.checkProgress()
}

// dropProgress reports whether etcd would never answer a progress request
// on the stream now: when it holds no watcher (etcd has none to answer
// on), or a watcher a compaction cancelled (see requestProgress). Call
// with mu held.
func (ws *watchStream) dropProgress() bool {
	return len(ws.watchers) == 0 || len(ws.compacted) > 0
}

// waitsForStart reports whether a watcher on the stream asked to start
// above head: etcd drops a progress request then, as it judges such a
// watcher not synced (mvcc/watchable_store.go progressIfSync). A client
// watching from head+1, as kube-apiserver does from a resource version,
// gets no answer until the next write. Call with mu held.
func (ws *watchStream) waitsForStart(head int64) bool {
	for _, start := range ws.starts {
		if start > head {
			return true
		}
	}
	return false
}

// checkProgress sends the pending progress response if every watcher has
// delivered everything up to the target. The revision sent is the lowest
// delivered revision, which is >= the target and is a true statement for
// every watcher on the stream.
func (ws *watchStream) checkProgress() {
	ws.mu.Lock()
	if ws.progressTarget == 0 {
		ws.mu.Unlock()
		return
	}
	if ws.dropProgress() {
		ws.progressTarget = 0
		ws.mu.Unlock()
		return
	}
	rev := ws.hub.Head()
	for _, w := range ws.watchers {
		if w == nil {
			ws.mu.Unlock()
			return // being created; its loop will report progress
		}
		d := w.Delivered()
		if d < ws.progressTarget {
			ws.mu.Unlock()
			return
		}
		rev = min(rev, d)
	}
	rev = max(rev, ws.progressTarget)
	ws.progressTarget = 0
	ws.mu.Unlock()
	_ = ws.send(ws.ctx, &pb.WatchResponse{Header: ws.s.header(rev), WatchId: -1})
}

func (ws *watchStream) stopAll() {
	ws.mu.Lock()

	watchers := make([]*watch.Watcher, 0, len(ws.watchers))
	for _, w := range ws.watchers {
		if w != nil {
			watchers = append(watchers, w)
		}
	}
	ws.watchers = map[int64]*watch.Watcher{}
	ws.compacted = map[int64]struct{}{}
	ws.starts = map[int64]int64{}
	ws.mu.Unlock()
	for _, w := range watchers {
		w.Stop()
	}
}
