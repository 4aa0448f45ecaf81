package version

import "testing"

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Version
		bad  bool
	}{
		{in: "0.10.0", want: Version{0, 10, 0}},
		{in: "v0.9.0", want: Version{0, 9, 0}},
		{in: "3.6", want: Version{3, 6, 0}},
		{in: "0.10.0-dev+v0.9.0-3-gaf32cfd", want: Version{0, 10, 0}},
		{in: "1.2.3+meta", want: Version{1, 2, 3}},
		{in: "", bad: true},
		{in: "3", bad: true},
		{in: "1.2.3.4", bad: true},
		{in: "a.b", bad: true},
		{in: "1..2", bad: true},
		{in: "01.2", bad: true},
		{in: "-1.2", bad: true},
	} {
		got, err := Parse(c.in)
		if c.bad {
			if err == nil {
				t.Errorf("Parse(%q) = %v, want an error", c.in, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("Parse(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
}

func TestCurrentIsRelease(t *testing.T) {
	if got := Current().String(); got != Release {
		t.Fatalf("Current() = %s, Release = %s", got, Release)
	}
}

func TestBuild(t *testing.T) {
	for stamp, want := range map[string]string{
		"v" + Release:            Release,
		"":                       Release + "-dev",
		"v0.9.0-3-gaf32cfd":      Release + "-dev+0.9.0-3-gaf32cfd",
		"af32cfd-dirty":          Release + "-dev+af32cfd-dirty",
		"v" + Release + "-dirty": Release + "-dev+" + Release + "-dirty",
	} {
		if got := Build(stamp); got != want {
			t.Errorf("Build(%q) = %q, want %q", stamp, got, want)
		}
	}
}

func TestLessComparesMajorMinor(t *testing.T) {
	for _, c := range []struct {
		a, b Version
		less bool
	}{
		{Version{0, 9, 5}, Version{0, 10, 0}, true},
		{Version{0, 10, 0}, Version{0, 9, 9}, false},
		{Version{0, 10, 1}, Version{0, 10, 0}, false},
		{Version{0, 10, 0}, Version{0, 10, 1}, false},
		{Version{0, 99, 0}, Version{1, 0, 0}, true},
	} {
		if got := c.a.Less(c.b); got != c.less {
			t.Errorf("%v.Less(%v) = %v", c.a, c.b, got)
		}
	}
}

// TestReleasesReadEachOther holds the table to the rule: each release
// reads what the one before it writes, and this one reads what the last
// listed release writes.
func TestReleasesReadEachOther(t *testing.T) {
	rs := append(Releases(), Known{Version: Current().MajorMinor(), Writes: StorageFormat, Reads: OldestStorageFormat})
	for i := 1; i < len(rs); i++ {
		prev, cur := rs[i-1], rs[i]
		if !prev.Version.Less(cur.Version) {
			t.Errorf("releases out of order: %v before %v", prev.Version, cur.Version)
		}
		if prev.Writes < cur.Reads || prev.Writes > cur.Writes {
			t.Errorf("%v reads formats %d..%d, but %v writes %d", cur.Version, cur.Reads, cur.Writes, prev.Version, prev.Writes)
		}
	}
	if p, ok := Previous(Current()); !ok || p.Version != rs[len(rs)-2].Version {
		t.Errorf("Previous(%v) = %v, %v", Current(), p, ok)
	}
	if _, ok := Previous(Version{0, 9, 0}); ok {
		t.Errorf("Previous(0.9) is known; no release before 0.9 is listed")
	}
}
