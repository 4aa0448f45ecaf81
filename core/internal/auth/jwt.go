package auth

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// jwtTokens are etcd's JWT tokens: claims username, revision and exp,
// signed with a key every member holds, so any member verifies them.
type jwtTokens struct {
	method jwt.SigningMethod
	sign   any // private key (or HMAC secret); nil: verify only
	verify any
	ttl    time.Duration
}

func newJWT(opts string) (*jwtTokens, error) {
	t := &jwtTokens{ttl: 5 * time.Minute}
	var pub, priv, method string
	for _, kv := range strings.Split(opts, ",") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("option %q is not key=value", kv)
		}
		switch k {
		case "pub-key":
			pub = v
		case "priv-key":
			priv = v
		case "sign-method":
			method = v
		case "ttl":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return nil, fmt.Errorf("ttl %q: not a positive duration", v)
			}
			t.ttl = d
		default:
			return nil, fmt.Errorf("unknown option %q", k)
		}
	}
	t.method = jwt.GetSigningMethod(method)
	if t.method == nil {
		return nil, fmt.Errorf("sign-method %q is not known", method)
	}
	read := func(name, path string) ([]byte, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return b, nil
	}
	switch t.method.(type) {
	case *jwt.SigningMethodHMAC:
		if priv == "" {
			return nil, errors.New("priv-key is required for " + method)
		}
		b, err := read("priv-key", priv)
		if err != nil {
			return nil, err
		}
		t.sign, t.verify = b, b
		return t, nil
	}
	if pub == "" {
		return nil, errors.New("pub-key is required")
	}
	b, err := read("pub-key", pub)
	if err != nil {
		return nil, err
	}
	keys, err := parsersOf(t.method)
	if err == nil {
		t.verify, err = keys.public(b)
	}
	if err != nil {
		return nil, fmt.Errorf("pub-key %s: %w", pub, err)
	}
	if priv != "" {
		b, err := read("priv-key", priv)
		if err != nil {
			return nil, err
		}
		if t.sign, err = keys.private(b); err != nil {
			return nil, fmt.Errorf("priv-key %s: %w", priv, err)
		}
	}
	return t, nil
}

// pemParsers are the PEM key parsers of one family of signing methods
// (crypto.PublicKey and crypto.PrivateKey are any).
type pemParsers struct{ public, private func([]byte) (any, error) }

// parsersOf returns the PEM key parsers of m's family of signing methods.
func parsersOf(m jwt.SigningMethod) (pemParsers, error) {
	switch m.(type) {
	case *jwt.SigningMethodRSA, *jwt.SigningMethodRSAPSS:
		return pemParsers{anyKey(jwt.ParseRSAPublicKeyFromPEM), anyKey(jwt.ParseRSAPrivateKeyFromPEM)}, nil
	case *jwt.SigningMethodECDSA:
		return pemParsers{anyKey(jwt.ParseECPublicKeyFromPEM), anyKey(jwt.ParseECPrivateKeyFromPEM)}, nil
	case *jwt.SigningMethodEd25519:
		return pemParsers{anyKey(jwt.ParseEdPublicKeyFromPEM), anyKey(jwt.ParseEdPrivateKeyFromPEM)}, nil
	}
	return pemParsers{}, fmt.Errorf("sign-method %s is not supported", m.Alg())
}

// anyKey makes a parser of one key type a parser of any key.
func anyKey[K any](parse func([]byte) (K, error)) func([]byte) (any, error) {
	return func(b []byte) (any, error) {
		k, err := parse(b)
		return k, err
	}
}

func (t *jwtTokens) assign(_ context.Context, user string, rev uint64) (string, error) {
	if t.sign == nil {
		return "", errors.New("auth: this member has no JWT priv-key and cannot issue tokens")
	}
	tk := jwt.NewWithClaims(t.method, jwt.MapClaims{
		"username": user,
		"revision": rev,
		"exp":      time.Now().Add(t.ttl).Unix(),
	})
	s, err := tk.SignedString(t.sign)
	if err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	return s, nil
}

func (t *jwtTokens) info(token string, _ uint64) (*Info, bool) {
	parsed, err := jwt.Parse(token, func(*jwt.Token) (any, error) { return t.verify, nil },
		jwt.WithValidMethods([]string{t.method.Alg()}), jwt.WithExpirationRequired())
	if err != nil || !parsed.Valid {
		return nil, false
	}
	claims, ok := parsed.Claims.(jwt.MapClaims)
	if !ok {
		return nil, false
	}
	user, ok1 := claims["username"].(string)
	rev, ok2 := claims["revision"].(float64)
	if !ok1 || !ok2 {
		return nil, false
	}
	return &Info{Username: user, Revision: uint64(rev)}, true
}

// invalidate has nothing to drop: a JWT names its revision, which the
// change of users has moved past.
func (t *jwtTokens) invalidate(func(string) bool) {}
