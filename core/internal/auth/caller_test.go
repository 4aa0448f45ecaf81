package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"log/slog"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// TestCallerTokenAndCertificate pins etcd 3.6's AuthInfoFromCtx order: a
// token wins over a verified certificate (a bad token is refused even with
// a good certificate), a certificate's CN names a caller without a token
// only with client certificate authentication, and a gRPC gateway's own
// certificate names nobody.
func TestCallerTokenAndCertificate(t *testing.T) {
	tokens, _ := NewTokens("simple", 0)
	st := emptyState()
	st.Enabled = true
	st.Users["alice"] = &User{Name: "alice", NoPassword: true}
	st.Users["bob"] = &User{Name: "bob"}
	st.derive()
	s := &Store{tokens: tokens, log: slog.Default(), certAuth: true}
	s.cur.Store(st)
	bobTok, err := tokens.assign(context.Background(), "bob", st.Revision)
	if err != nil {
		t.Fatal(err)
	}
	withCert := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{
		VerifiedChains: [][]*x509.Certificate{{{Subject: pkix.Name{CommonName: "alice"}}}},
	}}})
	md := func(ctx context.Context, kv ...string) context.Context {
		return metadata.NewIncomingContext(ctx, metadata.Pairs(kv...))
	}
	name := func(ctx context.Context) (string, error) {
		ai, err := s.Caller(ctx)
		if ai == nil {
			return "", err
		}
		return ai.Username, err
	}
	for _, c := range []struct {
		what    string
		ctx     context.Context
		want    string
		wantErr error
	}{
		{"certificate alone", md(withCert), "alice", nil},
		{"token and certificate", md(withCert, "token", bobTok), "bob", nil},
		{"bad token and certificate", md(withCert, "token", "nope.1"), "", rpctypes.ErrGRPCInvalidAuthToken},
		{"gateway certificate", md(withCert, "grpcgateway-accept", "x"), "", nil},
		{"neither", md(context.Background()), "", nil},
	} {
		got, err := name(c.ctx)
		if got != c.want || !errors.Is(err, c.wantErr) {
			t.Errorf("%s: %q, %v; want %q, %v", c.what, got, err, c.want, c.wantErr)
		}
	}
	s.certAuth = false
	if got, _ := name(md(withCert)); got != "" {
		t.Errorf("certificate without client certificate auth names %q", got)
	}
}
