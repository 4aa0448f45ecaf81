package auth

import (
	"context"
	"crypto/rand"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"time"
)

// Tokens make and read the tokens Authenticate hands out.
type Tokens interface {
	assign(ctx context.Context, user string, rev uint64) (string, error)
	// info names the token's user; rev is the state's revision, which a
	// simple token (carrying none) is taken at, as etcd takes it.
	info(token string, rev uint64) (*Info, bool)
	// invalidate drops the tokens of the users drop names.
	invalidate(drop func(user string) bool)
}

// DefaultTokenTTL is etcd's simple token lifetime after its last use.
const DefaultTokenTTL = 300 * time.Second

// NewTokens parses etcd's --auth-token value: "simple" (or empty) or
// "jwt,pub-key=FILE,priv-key=FILE,sign-method=ALG[,ttl=DURATION]".
func NewTokens(spec string, ttl time.Duration) (Tokens, error) {
	if ttl <= 0 {
		ttl = DefaultTokenTTL
	}
	kind, opts, _ := strings.Cut(spec, ",")
	switch kind {
	case "", "simple":
		if opts != "" {
			return nil, fmt.Errorf("auth-token %q: simple takes no options", spec)
		}
		return &simpleTokens{ttl: ttl, tokens: map[string]*simpleToken{}}, nil
	case "jwt":
		t, err := newJWT(opts)
		if err != nil {
			return nil, fmt.Errorf("auth-token %q: %w", spec, err)
		}
		return t, nil
	}
	return nil, fmt.Errorf("auth-token %q: unknown token type %q (want simple or jwt)", spec, kind)
}

// simpleTokens are etcd's "simple" tokens: a random string and a counter,
// known only to the member that issued them, living ttl after last use.
type simpleTokens struct {
	ttl    time.Duration
	mu     sync.Mutex
	next   uint64
	tokens map[string]*simpleToken
}

type simpleToken struct {
	user    string
	expires time.Time
}

const tokenLetters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

func (t *simpleTokens) assign(_ context.Context, user string, _ uint64) (string, error) {
	var b strings.Builder
	for range 16 {
		n, err := rand.Int(rand.Reader, big.NewInt(int64(len(tokenLetters))))
		if err != nil {
			return "", fmt.Errorf("generate token: %w", err)
		}
		b.WriteByte(tokenLetters[n.Int64()])
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	for k, v := range t.tokens { // expired tokens go as new ones come
		if now.After(v.expires) {
			delete(t.tokens, k)
		}
	}
	t.next++
	tok := fmt.Sprintf("%s.%d", b.String(), t.next)
	t.tokens[tok] = &simpleToken{user: user, expires: now.Add(t.ttl)}
	return tok, nil
}

func (t *simpleTokens) info(token string, rev uint64) (*Info, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v := t.tokens[token]
	now := time.Now()
	if v == nil || now.After(v.expires) {
		delete(t.tokens, token)
		return nil, false
	}
	v.expires = now.Add(t.ttl)
	return &Info{Username: v.user, Revision: rev}, true
}

func (t *simpleTokens) invalidate(drop func(string) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, v := range t.tokens {
		if drop(v.user) {
			delete(t.tokens, k)
		}
	}
}
