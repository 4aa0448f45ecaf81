package compression

import (
	"strings"
	"testing"
)

// TestChoose: every listed name and the empty name pick their setting; an
// unknown name is refused with the names it could have been.
func TestChoose(t *testing.T) {
	for name, want := range map[string]int{"": 0, "none": 0, "snappy": 1, "zstd": 2} {
		got, err := Choose(name, 0, 1, 2)
		if err != nil || got != want {
			t.Errorf("Choose(%q) = %d, %v; want %d", name, got, err, want)
		}
	}
	for _, name := range Names {
		if _, err := Choose(name, 0, 1, 2); err != nil {
			t.Errorf("Choose(%q), a listed name: %v", name, err)
		}
	}
	_, err := Choose("lz4", 0, 1, 2)
	if err == nil || !strings.Contains(err.Error(), `"lz4"`) || !strings.Contains(err.Error(), "none, snappy, zstd") {
		t.Errorf("Choose(lz4) = %v, want an error naming lz4 and the choices", err)
	}
}
