package server

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/engramkv/engram/core/internal/auth"
)

// openAuth loads the auth state from the store and keeps it current until
// runCtx ends: each member polls the revision record, so changes the
// leader commits reach followers (and a node that was follower before).
// A bad auth-token value stops start-up with an error naming it.
func (s *Server) openAuth(ctx, runCtx context.Context) (*auth.Store, error) {
	tokens, err := auth.NewTokens(s.opts.Auth.Token, s.opts.Auth.TokenTTL)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	st, err := auth.Open(ctx, auth.Options{
		Store:      s.opts.Store,
		Tokens:     tokens,
		BcryptCost: s.opts.Auth.BcryptCost,
		// Verified client chains exist only when the listener verifies
		// client certificates (tls.client-ca-file), which is when etcd's
		// --client-cert-auth names a caller by its certificate.
		ClientCertAuth: true,
		Logger:         s.log.With("component", "auth"),
	})
	if err != nil {
		return nil, fmt.Errorf("server: open auth state: %w", err)
	}
	s.auth = st
	go st.Run(runCtx)
	return st, nil
}

// forwardCallerOptions sign, on the connection to the leader, the caller
// this follower named (auth/forward.go): the leader cannot name it again
// from a simple token only this member knows, nor from a client
// certificate the follower's connection does not carry.
func (s *Server) forwardCallerOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(s.signCaller(ctx, auth.ForwardTTL), method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(s.signCaller(ctx, auth.ForwardStreamTTL), desc, cc, method, opts...)
		}),
	}
}

// signCaller replaces the client's credentials in the outgoing metadata
// with the signed caller. Without a caller, or when naming it failed, the
// call goes unchanged so that the leader gives the same answer.
func (s *Server) signCaller(ctx context.Context, ttl time.Duration) context.Context {
	st := s.auth
	if st == nil || !st.Enabled() {
		return ctx
	}
	ai, err := st.Caller(ctx) // the incoming metadata and peer are still in ctx
	if err != nil || ai == nil {
		return ctx
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Delete(rpctypes.TokenFieldNameGRPC)
	md.Delete(rpctypes.TokenFieldNameSwagger)
	md.Set(auth.ForwardedCallerHeader, st.SignForward(ai, time.Now(), ttl))
	return metadata.NewOutgoingContext(ctx, md)
}
