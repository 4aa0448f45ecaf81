package auth

import (
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/authpb"
)

// TestNewTokensRefusesBadSpecs: a bad --auth-token value is an error that
// names it, never a silent fallback to simple tokens.
func TestNewTokensRefusesBadSpecs(t *testing.T) {
	for _, spec := range []string{"simpel", "simple,ttl=1s", "jwt", "jwt,sign-method=RS256", "jwt,sign-method=NOPE,pub-key=x", "jwt,pub-key=/nonexistent,sign-method=RS256", "jwt,ttl=-1s,sign-method=RS256"} {
		_, err := NewTokens(spec, 0)
		if err == nil || !strings.Contains(err.Error(), spec) {
			t.Errorf("NewTokens(%q) = %v, want an error naming it", spec, err)
		}
	}
	if _, err := NewTokens("", 0); err != nil {
		t.Errorf("empty spec: %v, want simple tokens", err)
	}
}

// TestMergedRanges pins etcd's range rules: one key, [key, end), "from key"
// with end "\x00", and a request spanning two touching grants.
func TestMergedRanges(t *testing.T) {
	st := emptyState()
	st.Users["u"] = &User{Name: "u", Roles: []string{"a", "b"}}
	st.Roles["a"] = &Role{Name: "a", Perms: []Perm{{Type: authpb.READ, Key: []byte("/a"), RangeEnd: []byte("/b")}, {Type: authpb.WRITE, Key: []byte("/k")}}}
	st.Roles["b"] = &Role{Name: "b", Perms: []Perm{{Type: authpb.READWRITE, Key: []byte("/b"), RangeEnd: []byte("/c")}, {Type: authpb.READ, Key: []byte("/z"), RangeEnd: []byte{0}}}}
	st.derive()
	p := st.perms["u"]
	for _, c := range []struct {
		write    bool
		key, end string
		want     bool
	}{
		{false, "/a", "", true}, {false, "/a", "/c", true}, {false, "/a", "/c\x00", false},
		{true, "/a", "", false}, {true, "/b", "/c", true}, {true, "/k", "", true}, {true, "/k", "/k\x00", true},
		{true, "/k\x00", "", false}, {false, "/zz", "\x00", true}, {false, "/y", "\x00", false}, {false, "/zzz", "", true},
	} {
		ivs := p.read
		if c.write {
			ivs = p.write
		}
		if got := covers(ivs, []byte(c.key), []byte(c.end)); got != c.want {
			t.Errorf("write=%v [%q, %q): %v, want %v", c.write, c.key, c.end, got, c.want)
		}
	}
}
