package coder

import (
	"bytes"
	"sort"
	"testing"
)

func sign(x int) int {
	switch {
	case x < 0:
		return -1
	case x > 0:
		return 1
	}
	return 0
}

func FuzzObjectKeyRoundTrip(f *testing.F) {
	for _, s := range []string{"", "a", "\x00", "\x00\x01", "\x00\xff", "a\x00b", "/registry/pods/default/x", "\xff\xff"} {
		f.Add([]byte(s), int64(7))
	}
	f.Fuzz(func(t *testing.T, key []byte, rev int64) {
		if rev < 0 {
			rev = -rev
		}
		if rev < 0 {
			rev = 0
		}
		k, r, err := DecodeObjectKey(ObjectKey(key, rev))
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if !bytes.Equal(k, key) || r != rev {
			t.Fatalf("round trip: got (%q,%d) want (%q,%d)", k, r, key, rev)
		}
		rk, err := DecodeRevisionKey(RevisionKey(key))
		if err != nil || !bytes.Equal(rk, key) {
			t.Fatalf("revision key round trip: %q %v", rk, err)
		}
		id, lk, err := DecodeLeaseIndexKey(LeaseIndexKey(rev, key))
		if err != nil || id != rev || !bytes.Equal(lk, key) {
			t.Fatalf("lease index round trip: %d %q %v", id, lk, err)
		}
	})
}

func FuzzOrderPreserving(f *testing.F) {
	f.Add([]byte("a"), []byte("a\x00"), int64(5), int64(1))
	f.Add([]byte("a"), []byte("ab"), int64(1), int64(5))
	f.Add([]byte("a\x00"), []byte("a\x01"), int64(9), int64(2))
	f.Add([]byte(""), []byte("\x00"), int64(1), int64(1))
	f.Add([]byte("a\xff"), []byte("a\x00\xff"), int64(3), int64(3))
	f.Fuzz(func(t *testing.T, a, b []byte, ra, rb int64) {
		if ra < 0 || rb < 0 {
			return
		}
		want := sign(bytes.Compare(a, b))
		if want == 0 {
			if ra > rb {
				want = 1
			} else if ra < rb {
				want = -1
			}
		}
		if got := sign(bytes.Compare(ObjectKey(a, ra), ObjectKey(b, rb))); got != want {
			t.Fatalf("order of (%q,%d) vs (%q,%d): got %d want %d", a, ra, b, rb, got, want)
		}
		if !bytes.Equal(a, b) {
			if got := sign(bytes.Compare(RevisionKey(a), RevisionKey(b))); got != sign(bytes.Compare(a, b)) {
				t.Fatalf("revision key order of %q vs %q", a, b)
			}
		}
	})
}

// TestRangeBounds checks that the internal range of [key, end) contains
// exactly the internal keys of the etcd keys in that range.
func TestRangeBounds(t *testing.T) {
	keys := []string{"", "a", "a\x00", "a\x00\x00", "a\x01", "a\xff", "ab", "b", "b\x00", "\xff"}
	ranges := [][2]string{
		{"a", ""}, {"a", "b"}, {"a", "a\x00"}, {"a\x00", "ab"}, {"a", "\x00"}, {"", "\x00"}, {"b", "c"}, {"a\xff", "b"},
	}
	for _, rg := range ranges {
		key, end := []byte(rg[0]), []byte(rg[1])
		for _, space := range []Space{SpaceObject, SpaceRevision} {
			start, stop := keyRange(space, key, end)
			for _, k := range keys {
				var in bool
				switch {
				case len(end) == 0:
					in = k == rg[0]
				case len(end) == 1 && end[0] == 0:
					in = k >= rg[0]
				default:
					in = k >= rg[0] && k < rg[1]
				}
				for _, rev := range []int64{0, 1, 1 << 40, 1<<63 - 1} {
					var ik []byte
					if space == SpaceObject {
						ik = ObjectKey([]byte(k), rev)
					} else {
						ik = RevisionKey([]byte(k))
					}
					got := bytes.Compare(ik, start) >= 0 && bytes.Compare(ik, stop) < 0
					if got != in {
						t.Errorf("space %c range [%q,%q) key %q rev %d: in=%v want %v", space, key, end, k, rev, got, in)
					}
				}
			}
		}
	}
}

// TestPaginationFromLastKeyPlusZero reproduces how kube-apiserver paginates a
// list: the next page starts at lastKey+"\x00". With an order-preserving
// encoding the next page never returns lastKey again.
func TestPaginationFromLastKeyPlusZero(t *testing.T) {
	raw := []string{"/registry/pods/a", "/registry/pods/a-b", "/registry/pods/a$", "/registry/pods/a.b", "/registry/pods/ab"}
	var internal [][]byte
	for _, k := range raw {
		for rev := int64(1); rev <= 3; rev++ {
			internal = append(internal, ObjectKey([]byte(k), rev))
		}
	}
	sort.Slice(internal, func(i, j int) bool { return bytes.Compare(internal[i], internal[j]) < 0 })
	var seen []string
	from := []byte("/registry/pods/")
	end := []byte("/registry/pods0")
	for page := 0; page < 10; page++ {
		start, stop := ObjectRange(from, end)
		var next []byte
		for _, ik := range internal {
			if bytes.Compare(ik, start) >= 0 && bytes.Compare(ik, stop) < 0 {
				k, _, err := DecodeObjectKey(ik)
				if err != nil {
					t.Fatal(err)
				}
				next = k
				break
			}
		}
		if next == nil {
			break
		}
		seen = append(seen, string(next))
		from = append(bytes.Clone(next), 0)
	}
	sorted := append([]string(nil), raw...)
	sort.Strings(sorted)
	if len(seen) != len(sorted) {
		t.Fatalf("pages returned %q, want each of %q once", seen, sorted)
	}
	for i := range seen {
		if seen[i] != sorted[i] {
			t.Fatalf("page %d returned %q, want %q", i, seen[i], sorted[i])
		}
	}
}

func TestMalformed(t *testing.T) {
	bad := [][]byte{nil, {1, 2, 3}, Prefix(SpaceObject), append(Prefix(SpaceObject), 'a'), append(Prefix(SpaceObject), 'a', 0, 7, 0, 0, 0, 0, 0, 0, 0, 0), append(Prefix(SpaceObject), 'a', 0, 1, 0)}
	for _, b := range bad {
		if _, _, err := DecodeObjectKey(b); err == nil {
			t.Errorf("DecodeObjectKey(%q) succeeded", b)
		}
	}
	if _, err := DecodeRevisionKey(ObjectKey([]byte("a"), 1)); err == nil {
		t.Error("object key decoded as revision key")
	}
	if _, err := DecodeEventKey(EventKey(5)[:6]); err == nil {
		t.Error("short event key decoded")
	}
}

func TestVersionsRange(t *testing.T) {
	start, stop := ObjectVersions([]byte("k"), 3, 5)
	for rev := int64(0); rev < 8; rev++ {
		ik := ObjectKey([]byte("k"), rev)
		in := bytes.Compare(ik, start) >= 0 && bytes.Compare(ik, stop) < 0
		if in != (rev >= 3 && rev <= 5) {
			t.Errorf("rev %d in=%v", rev, in)
		}
	}
	if ik := ObjectKey([]byte("k\x00"), 4); bytes.Compare(ik, start) >= 0 && bytes.Compare(ik, stop) < 0 {
		t.Error("another key inside the versions range")
	}
}

func BenchmarkObjectKey(b *testing.B) {
	key := []byte("/registry/pods/kube-system/coredns-5d78c9869d-abcde-0123456789-xyz")
	b.ReportAllocs()
	for b.Loop() {
		_ = ObjectKey(key, 123456789)
	}
}

func BenchmarkDecodeObjectKey(b *testing.B) {
	ik := ObjectKey([]byte("/registry/pods/kube-system/coredns-5d78c9869d-abcde-0123456789-xyz"), 123456789)
	b.ReportAllocs()
	for b.Loop() {
		_, _, _ = DecodeObjectKey(ik)
	}
}

// TestInRange pins etcd's three range forms on plain keys, and that InRange
// agrees with RevisionRange's internal bounds for every probe: a key is in
// the etcd range exactly when its revision key is in the internal range.
func TestInRange(t *testing.T) {
	cases := []struct {
		name     string
		key, end string
		in, out  []string
	}{
		{"single key", "b", "", []string{"b"}, []string{"", "a", "b\x00", "ba", "c"}},
		{"half-open", "b", "d", []string{"b", "b\x00", "c", "cz"}, []string{"a", "d", "d\x00", "e"}},
		{"from key", "b", "\x00", []string{"b", "c", "\xff\xff"}, []string{"", "a", "a\xff"}},
		{"every key", "\x00", "\x00", []string{"\x00", "a", "\xff"}, []string{""}},
	}
	for _, c := range cases {
		start, stop := RevisionRange([]byte(c.key), []byte(c.end))
		check := func(k string, want bool) {
			if got := InRange([]byte(k), []byte(c.key), []byte(c.end)); got != want {
				t.Errorf("%s: InRange(%q, %q, %q) = %v, want %v", c.name, k, c.key, c.end, got, want)
			}
			rk := RevisionKey([]byte(k))
			if internal := bytes.Compare(rk, start) >= 0 && bytes.Compare(rk, stop) < 0; internal != want {
				t.Errorf("%s: revision key of %q inside RevisionRange = %v, want %v", c.name, k, internal, want)
			}
		}
		for _, k := range c.in {
			check(k, true)
		}
		for _, k := range c.out {
			check(k, false)
		}
	}
}
