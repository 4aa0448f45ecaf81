package workload

import (
	"strings"
	"testing"
)

func TestExistingLayout(t *testing.T) {
	c := Defaults()
	c.Prefix, c.PrefixObjects, c.DataSet = "/scale/", 100, 250
	seen := map[string]bool{}
	for i := range c.DataSet {
		k := c.existingKey(i)
		if seen[k] {
			t.Fatalf("object %d: key %q repeats", i, k)
		}
		seen[k] = true
		want := "/scale/000/load/"
		if i >= 200 {
			want = "/scale/002/load/"
		} else if i >= 100 {
			want = "/scale/001/load/"
		}
		if !strings.HasPrefix(k, want) || len(k) != c.KeySize {
			t.Fatalf("object %d: key %q, want prefix %q and %d bytes", i, k, want, c.KeySize)
		}
	}
	// Without sub-prefixes the objects are exactly the load workload's keys.
	c.PrefixObjects = 0
	if got, want := c.existingKey(7), newKeyspace("/scale/", Load, c.KeySize, c.KeyOrder).key(7); got != want {
		t.Fatalf("existingKey(7) = %q, want %q", got, want)
	}
	c.LoadFrom = 250
	if err := c.validateExisting(); err == nil {
		t.Fatal("load from = data set accepted")
	}
}
