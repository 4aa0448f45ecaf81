package mvcc

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/memkv"
)

// TestWorkedExample performs the package doc's worked example on the
// in-memory engine and compares everything the engine holds after each step
// with the doc's table for that step, so the example cannot go stale: a
// change to the layout or the records fails here until doc.go shows it.
func TestWorkedExample(t *testing.T) {
	ctx := context.Background()
	tables := docExampleTables(t)
	store := memkv.New()
	b := open(t, store)
	steps := []struct {
		what string
		do   func() error
	}{
		{"create k", func() error { return expectRev(put(t, b, "k", "v1"), 2) }},
		{"update k", func() error { return expectRev(put(t, b, "k", "v2"), 3) }},
		{"delete k", func() error { return expectRev(del(t, b, "k"), 4) }},
		{"re-create k", func() error { return expectRev(put(t, b, "k", "v3"), 5) }},
		{"compact at 4", func() error {
			_, err := b.Compact(ctx, 4, true)
			return err
		}},
	}
	if len(tables) != len(steps) {
		t.Fatalf("doc.go's worked example has %d tables, want one for each of the %d steps", len(tables), len(steps))
	}
	for i, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		got := engineContent(t, store)
		if !equalFields(got, tables[i]) {
			t.Errorf("after %s the engine holds:\n\t%s\ndoc.go shows:\n\t%s", s.what, strings.Join(got, "\n\t"), strings.Join(tables[i], "\n\t"))
		}
	}
}

func expectRev(got, want int64) error {
	if got != want {
		return fmt.Errorf("revision %d, want %d", got, want)
	}
	return nil
}

// docExampleTables returns the code blocks of doc.go's "Worked example"
// section, in order; each line is one engine key and its value.
func docExampleTables(t *testing.T) [][]string {
	t.Helper()
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var tables [][]string
	in, inBlock := false, false
	for _, line := range strings.Split(string(src), "\n") {
		switch {
		case strings.HasPrefix(line, "// # "):
			in = line == "// # Worked example"
			inBlock = false
		case !in:
		case strings.HasPrefix(line, "//\t"):
			if !inBlock {
				tables = append(tables, nil)
				inBlock = true
			}
			tables[len(tables)-1] = append(tables[len(tables)-1], strings.TrimPrefix(line, "//\t"))
		default:
			inBlock = false
		}
	}
	return tables
}

// engineContent renders every pair the engine holds, in key order, as
// "key -> value" in the doc's notation: the 4-byte magic as magic('<space>'),
// runs of printable bytes quoted, every other byte in hex.
func engineContent(t *testing.T, s kv.Store) []string {
	t.Helper()
	var out []string
	if err := kv.ScanEach(context.Background(), s, kv.ScanOptions{}, func(p kv.Pair) error {
		if len(p.Key) < 4 || !bytes.Equal(p.Key[:4], coder.Prefix(coder.Space(p.Key[3]))) {
			out = append(out, fmt.Sprintf("%s -> %s", renderBytes(p.Key), renderBytes(p.Value)))
			return nil
		}
		out = append(out, fmt.Sprintf("magic('%c') %s -> %s", p.Key[3], renderBytes(p.Key[4:]), renderBytes(p.Value)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func renderBytes(b []byte) string {
	var parts []string
	for len(b) > 0 {
		n := 0
		for n < len(b) && b[n] > ' ' && b[n] < 0x7f && b[n] != '"' && b[n] != '\\' {
			n++
		}
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%q", b[:n]))
			b = b[n:]
			continue
		}
		parts = append(parts, fmt.Sprintf("%02x", b[0]))
		b = b[1:]
	}
	return strings.Join(parts, " ")
}

// equalFields compares two tables line by line, ignoring how the doc aligns
// its columns.
func equalFields(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if strings.Join(strings.Fields(a[i]), " ") != strings.Join(strings.Fields(b[i]), " ") {
			return false
		}
	}
	return true
}
