package auth

import (
	"context"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// Caller implements Checker as etcd 3.6's AuthInfoFromCtx, after a caller
// a follower signed on a forwarded call (forward.go): a token in the
// metadata wins (a certificate is then not looked at); without one, and
// only when client certificates are verified, the certificate's CN.
func (s *Store) Caller(ctx context.Context) (*Info, error) {
	if !s.Enabled() {
		return nil, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if fw := md.Get(ForwardedCallerHeader); len(fw) > 0 {
		ai, err := s.verifyForward(fw[0], time.Now())
		if err != nil {
			return nil, err
		}
		s.catchUp(ctx, ai)
		return ai, nil
	}
	ts := md.Get(rpctypes.TokenFieldNameGRPC)
	if len(ts) == 0 {
		ts = md.Get(rpctypes.TokenFieldNameSwagger)
	}
	if len(ts) > 0 {
		tok := strings.TrimPrefix(ts[0], "Bearer ")
		ai, ok := s.tokens.info(tok, s.Revision())
		if !ok {
			return nil, rpctypes.ErrGRPCInvalidAuthToken
		}
		s.catchUp(ctx, ai)
		return ai, nil
	}
	if !s.certAuth {
		return nil, nil
	}
	return s.fromTLSPeer(ctx, md), nil
}

// catchUp reloads the state when ai comes from a member that has seen a
// newer one, rather than call it old or refuse its user.
func (s *Store) catchUp(ctx context.Context, ai *Info) {
	if ai.Revision > s.Revision() {
		if err := s.refresh(ctx); err != nil {
			s.log.Warn("reload auth state for a newer caller", "err", err)
		}
	}
}

func (s *Store) fromTLSPeer(ctx context.Context, md metadata.MD) *Info {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil
	}
	for _, chain := range ti.State.VerifiedChains {
		if len(chain) == 0 {
			continue
		}
		// etcd ignores the CN of a gRPC-gateway's own certificate.
		if len(md.Get("grpcgateway-accept")) > 0 {
			return nil
		}
		return &Info{Username: chain[0].Subject.CommonName, Revision: s.Revision()}
	}
	return nil
}
