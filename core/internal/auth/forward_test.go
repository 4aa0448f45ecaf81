package auth

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/engramkv/engram/engines/memkv"
)

// TestForwardKeyShared: the first member to open creates the key and every
// later one reads the same key back.
func TestForwardKeyShared(t *testing.T) {
	ctx := context.Background()
	st := memkv.New()
	a, err := loadForwardKey(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	b, err := loadForwardKey(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 32 || !bytes.Equal(a, b) {
		t.Fatalf("keys %x and %x, want one 32-byte key", a, b)
	}
}

// TestForwardedCaller: a signed caller round-trips and names the caller
// even over a token or certificate; a tampered, expired or foreign one is
// the invalid token error; without the header the token path is unchanged.
func TestForwardedCaller(t *testing.T) {
	tokens, _ := NewTokens("simple", 0)
	st := emptyState()
	st.Enabled = true
	st.Revision = 7
	st.Users["alice"] = &User{Name: "alice"}
	st.Users["bob"] = &User{Name: "bob"}
	st.derive()
	s := &Store{tokens: tokens, log: slog.Default(), certAuth: true, fwdKey: bytes.Repeat([]byte{1}, 32)}
	s.cur.Store(st)
	other := &Store{fwdKey: bytes.Repeat([]byte{2}, 32)}
	bobTok, err := tokens.assign(context.Background(), "bob", st.Revision)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	good := s.SignForward(&Info{Username: "alice,x", Revision: 7}, now, ForwardTTL)
	fields := strings.Split(good, ",")
	forgedUser := strings.Replace(good, fields[0], base64.RawURLEncoding.EncodeToString([]byte("bob")), 1)
	mac := []byte(fields[len(fields)-1])
	mac[0] ^= 1
	if mac[0] == good[len(good)-len(mac)] {
		t.Fatal("mac not changed")
	}
	forgedMAC := good[:len(good)-len(mac)] + string(mac)
	withCert := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{
		VerifiedChains: [][]*x509.Certificate{{{Subject: pkix.Name{CommonName: "bob"}}}},
	}}})
	md := func(ctx context.Context, kv ...string) context.Context {
		return metadata.NewIncomingContext(ctx, metadata.Pairs(kv...))
	}
	for _, c := range []struct {
		what    string
		ctx     context.Context
		want    string
		wantErr error
	}{
		{"signed", md(context.Background(), ForwardedCallerHeader, good), "alice,x", nil},
		{"signed over token and certificate", md(withCert, ForwardedCallerHeader, good, "token", bobTok), "alice,x", nil},
		{"tampered user", md(context.Background(), ForwardedCallerHeader, forgedUser), "", rpctypes.ErrGRPCInvalidAuthToken},
		{"tampered mac", md(context.Background(), ForwardedCallerHeader, forgedMAC), "", rpctypes.ErrGRPCInvalidAuthToken},
		{"expired", md(context.Background(), ForwardedCallerHeader, s.SignForward(&Info{Username: "alice", Revision: 7}, now, -2*time.Second)), "", rpctypes.ErrGRPCInvalidAuthToken},
		{"wrong key", md(context.Background(), ForwardedCallerHeader, other.SignForward(&Info{Username: "alice", Revision: 7}, now, ForwardTTL)), "", rpctypes.ErrGRPCInvalidAuthToken},
		{"garbage", md(context.Background(), ForwardedCallerHeader, "root"), "", rpctypes.ErrGRPCInvalidAuthToken},
		{"invalid header and good token", md(context.Background(), ForwardedCallerHeader, forgedMAC, "token", bobTok), "", rpctypes.ErrGRPCInvalidAuthToken},
		{"no header, token", md(context.Background(), "token", bobTok), "bob", nil},
		{"no header, certificate", md(withCert), "bob", nil},
	} {
		ai, err := s.Caller(c.ctx)
		got := ""
		if ai != nil {
			got = ai.Username
		}
		if got != c.want || !errors.Is(err, c.wantErr) {
			t.Errorf("%s: %q, %v; want %q, %v", c.what, got, err, c.want, c.wantErr)
		}
	}
	// The signed revision is kept: a name signed before an auth change is
	// old, as a token from then would be.
	ai, err := s.Caller(md(context.Background(), ForwardedCallerHeader, s.SignForward(&Info{Username: "bob", Revision: 6}, now, ForwardTTL)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.IsPutPermitted(ai, []byte("k")); !errors.Is(err, rpctypes.ErrGRPCAuthOldRevision) {
		t.Fatalf("put with a name signed at an old revision: %v", err)
	}
}
