package backend

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// RangeRPCs records, as the server answered them, the Range and RangeStream
// RPCs one client sends. The suite's own KVRecorder counts calls of the
// client's KV methods, and the store calls GetStream even when the server
// turns out not to implement RangeStream (it falls back to paginated Range
// afterwards), so only the wire can tell whether a list was really streamed.
type RangeRPCs struct {
	mu      sync.Mutex
	ranges  []string // keys of unary Range requests
	streams []StreamCall
	// streamed is closed (and replaced) whenever a stream is recorded.
	streamed chan struct{}
}

// StreamCall is one finished RangeStream RPC.
type StreamCall struct {
	Key    string // the request's key (where the range starts)
	Chunks int    // RangeStreamResponse messages received
	// Err is the status the stream ended with; nil when the server closed
	// it cleanly after its last chunk.
	Err error
}

// Ranges returns the keys of the unary Range requests recorded since the
// last call whose key starts with prefix, and forgets all recorded ranges.
func (r *RangeRPCs) Ranges(prefix string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, k := range r.ranges {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	r.ranges = nil
	return out
}

// Streams returns the RangeStream RPCs finished since the last call, in the
// order they finished, and forgets them.
func (r *RangeRPCs) Streams() []StreamCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.streams
	r.streams = nil
	return out
}

// WaitStreams waits until at least n RangeStream RPCs finished since the
// last call of Streams or WaitStreams, or ctx ends, then returns them and
// forgets them. A watch may hand its initial events to the caller as the
// stream's chunks arrive, before the stream's end is read and recorded.
func (r *RangeRPCs) WaitStreams(ctx context.Context, n int) []StreamCall {
	for {
		r.mu.Lock()
		if len(r.streams) >= n {
			out := r.streams
			r.streams = nil
			r.mu.Unlock()
			return out
		}
		if r.streamed == nil {
			r.streamed = make(chan struct{})
		}
		ch := r.streamed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return r.Streams()
		}
	}
}

func (r *RangeRPCs) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(r.unary),
		grpc.WithChainStreamInterceptor(r.stream),
	}
}

func (r *RangeRPCs) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if rr, ok := req.(*pb.RangeRequest); ok && method == "/etcdserverpb.KV/Range" {
		r.mu.Lock()
		r.ranges = append(r.ranges, string(rr.Key))
		r.mu.Unlock()
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (r *RangeRPCs) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != "/etcdserverpb.KV/RangeStream" {
		return s, err
	}
	return &recordedStream{ClientStream: s, rpcs: r}, nil
}

// recordedStream counts a RangeStream's chunks and records the call when
// Recv reports its end, before the caller sees that end: the client closes
// its GetStream channel only after that, so a list that returned has been
// recorded.
type recordedStream struct {
	grpc.ClientStream
	rpcs *RangeRPCs
	call StreamCall
	done bool
}

func (s *recordedStream) SendMsg(m any) error {
	if rr, ok := m.(*pb.RangeRequest); ok {
		s.call.Key = string(rr.Key)
	}
	return s.ClientStream.SendMsg(m)
}

func (s *recordedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		s.call.Chunks++
		return nil
	}
	if !s.done {
		s.done = true
		if !errors.Is(err, io.EOF) {
			s.call.Err = err
		}
		s.rpcs.mu.Lock()
		s.rpcs.streams = append(s.rpcs.streams, s.call)
		if s.rpcs.streamed != nil {
			close(s.rpcs.streamed)
			s.rpcs.streamed = nil
		}
		s.rpcs.mu.Unlock()
	}
	return err
}
