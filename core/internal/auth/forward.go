package auth

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
)

// A follower forwards writes, leases and watch streams to the leader. The
// leader cannot name their caller again from the client's credentials: a
// simple token is known only to the member that issued it, and a caller
// named by its client certificate reaches the leader over the follower's
// own connection. The follower has already named the caller and checked
// the request, so it passes the name on in ForwardedCallerHeader, signed
// with HMAC-SHA256 under a key every member reads from the shared store.
// A member trusts the header only with a valid, unexpired signature; the
// key lives in the store's meta space, which no etcd call reads, so only
// a member (or whoever can read the store, who can do anything anyway)
// can sign. The signed auth revision makes a forwarded name go old on any
// auth change, as a token does.

// ForwardedCallerHeader is the gRPC metadata key of a signed caller.
const ForwardedCallerHeader = "engram-forwarded-caller"

// Lifetimes of a signed caller. A unary call is checked on arrival, so a
// short one bounds a replay. A stream's header is read again at every
// watch create on it, so it must outlive the stream; any auth change still
// makes it old at once, through the signed revision.
const (
	ForwardTTL       = 30 * time.Second
	ForwardStreamTTL = 24 * time.Hour
)

const forwardKeyRecord = "auth/forward-key"

// loadForwardKey reads the cluster's signing key, creating it if no member
// has: the first writer wins and every member reads the winner's key.
func loadForwardKey(ctx context.Context, st kv.Store) ([]byte, error) {
	k := coder.MetaKey(forwardKeyRecord)
	raw, err := st.Get(ctx, k)
	if err == nil {
		return checkKey(raw)
	}
	if !errors.Is(err, kv.ErrNotFound) {
		return nil, fmt.Errorf("read forward key: %w", err)
	}
	fresh := make([]byte, 32)
	if _, err := rand.Read(fresh); err != nil {
		return nil, fmt.Errorf("generate forward key: %w", err)
	}
	err = st.Commit(ctx, []kv.Op{kv.PutIfAbsent(k, fresh)})
	if err == nil {
		return fresh, nil
	}
	if _, lost := kv.AsConflict(err); !lost && !errors.Is(err, kv.ErrUncertain) {
		return nil, fmt.Errorf("create forward key: %w", err)
	}
	// Another member won, or our write's fate is unknown: the stored key
	// is the key either way.
	raw, err = st.Get(ctx, k)
	if err != nil {
		return nil, fmt.Errorf("read forward key back: %w", err)
	}
	return checkKey(raw)
}

func checkKey(raw []byte) ([]byte, error) {
	if len(raw) != 32 {
		return nil, fmt.Errorf("forward key record holds %d bytes, want 32", len(raw))
	}
	return bytes.Clone(raw), nil
}

// SignForward answers the ForwardedCallerHeader value naming ai until now+ttl.
func (s *Store) SignForward(ai *Info, now time.Time, ttl time.Duration) string {
	body := base64.RawURLEncoding.EncodeToString([]byte(ai.Username)) + "," +
		strconv.FormatUint(ai.Revision, 10) + "," + strconv.FormatInt(now.Add(ttl).Unix(), 10)
	return body + "," + base64.RawURLEncoding.EncodeToString(forwardMAC(s.fwdKey, body))
}

func forwardMAC(key []byte, body string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(body))
	return m.Sum(nil)
}

// verifyForward names the caller of a ForwardedCallerHeader value. Any
// flaw is the invalid token error: a header that is present but not valid
// is refused rather than ignored, since ignoring it would fall back to the
// other credentials of the call (the follower's own certificate, on a
// forwarded call) and name the wrong caller.
func (s *Store) verifyForward(v string, now time.Time) (*Info, error) {
	i := strings.LastIndexByte(v, ',')
	if i < 0 || len(s.fwdKey) == 0 {
		return nil, rpctypes.ErrGRPCInvalidAuthToken
	}
	body := v[:i]
	mac, err := base64.RawURLEncoding.DecodeString(v[i+1:])
	if err != nil || !hmac.Equal(mac, forwardMAC(s.fwdKey, body)) {
		return nil, rpctypes.ErrGRPCInvalidAuthToken
	}
	f := strings.Split(body, ",")
	if len(f) != 3 {
		return nil, rpctypes.ErrGRPCInvalidAuthToken
	}
	user, err1 := base64.RawURLEncoding.DecodeString(f[0])
	rev, err2 := strconv.ParseUint(f[1], 10, 64)
	exp, err3 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || now.Unix() > exp {
		return nil, rpctypes.ErrGRPCInvalidAuthToken
	}
	return &Info{Username: string(user), Revision: rev}, nil
}
