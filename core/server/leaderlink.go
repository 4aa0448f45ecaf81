package server

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// leaderLink is a follower's connection to the leader, which counts the
// unary calls in flight on it so that letting go of it can wait for them.
//
// Closing a connection cancels its calls at once, and a forwarded write
// cut that way is answered "leader changed" although the old leader may
// have applied it (etcdapi's forwardErr): the client sees an error with an
// unknown outcome. When the leader moved on (a hand-off, a failover to a
// live node), the old leader is usually alive: it answers each such call
// itself, with its result or by passing it on to its successor. So the
// link is closed only once its calls have ended, or after a bound for a
// leader that died and will never answer.
type leaderLink struct {
	conn *grpc.ClientConn

	mu      sync.Mutex
	calls   int
	closing bool
	idle    chan struct{} // closed when no call is left after closing began
}

// track is the link's unary client interceptor.
func (l *leaderLink) track(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	l.mu.Lock()
	l.calls++
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.calls--
		if l.closing && l.calls == 0 {
			close(l.idle)
			l.idle = nil
		}
	}()
	return invoker(ctx, method, req, reply, cc, opts...)
}

// closeWhenIdle closes the connection once the calls in flight on it have
// ended, or after bound, without blocking the caller. A call that starts
// after this finds the connection closed before sending anything, which
// etcdapi treats as never sent: it runs again under the next role.
func (l *leaderLink) closeWhenIdle(bound time.Duration) {
	l.mu.Lock()
	l.closing = true
	var idle <-chan struct{}
	if l.calls > 0 {
		l.idle = make(chan struct{})
		idle = l.idle
	}
	l.mu.Unlock()
	if idle == nil {
		_ = l.conn.Close()
		return
	}
	go func() {
		t := time.NewTimer(bound)
		defer t.Stop()
		select {
		case <-idle:
		case <-t.C:
		}
		_ = l.conn.Close()
	}()
}

// dialLeader connects to the leader's advertised URL through a leaderLink.
func (s *Server) dialLeader(url string) (*leaderLink, error) {
	l := &leaderLink{}
	conn, err := s.dial(url, grpc.WithChainUnaryInterceptor(l.track))
	if err != nil {
		return nil, err
	}
	l.conn = conn
	return l, nil
}
