package kv

import "testing"

func TestOpHolds(t *testing.T) {
	v, other := []byte("v"), []byte("w")
	for _, tc := range []struct {
		op      Op
		current []byte
		exists  bool
		want    bool
	}{
		{Put([]byte("k"), v), v, true, true},
		{Delete([]byte("k")), nil, false, true},
		{PutIfAbsent([]byte("k"), v), nil, false, true},
		{PutIfAbsent([]byte("k"), v), v, true, false},
		{CompareAndSwap([]byte("k"), v, other), v, true, true},
		{CompareAndSwap([]byte("k"), v, other), other, true, false},
		{CompareAndSwap([]byte("k"), v, other), nil, false, false},
		{CompareAndSwap([]byte("k"), []byte{}, other), []byte{}, true, true},
		{CompareAndSwap([]byte("k"), []byte{}, other), nil, false, false},
		{CompareAndDelete([]byte("k"), v), v, true, true},
		{CompareAndDelete([]byte("k"), v), nil, false, false},
	} {
		if got := tc.op.Holds(tc.current, tc.exists); got != tc.want {
			t.Errorf("%s expecting %q against %q (exists %v): holds %v, want %v", tc.op.Kind, tc.op.Expected, tc.current, tc.exists, got, tc.want)
		}
	}
}

func TestOpConflictCopies(t *testing.T) {
	key, cur := []byte("k"), []byte("cur")
	c := CompareAndSwap(key, []byte("x"), nil).Conflict(3, cur, true)
	key[0], cur[0] = 'X', 'X'
	if c.Index != 3 || string(c.Key) != "k" || !c.Exists || string(c.Current) != "cur" {
		t.Fatalf("conflict %+v does not own its key and value", c)
	}
	if c := PutIfAbsent([]byte("k"), nil).Conflict(0, []byte{}, true); c.Current == nil {
		t.Fatal("an existing empty value reads as nil")
	}
	if c := CompareAndSwap([]byte("k"), []byte("x"), nil).Conflict(0, nil, false); c.Exists || c.Current != nil {
		t.Fatalf("absent key: %+v", c)
	}
}
