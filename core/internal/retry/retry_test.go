package retry

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvfault"
	"github.com/engramkv/engram/engines/memkv"
)

func TestResolve(t *testing.T) {
	ctx := context.Background()
	s := kvfault.Wrap(memkv.New())
	if err := s.Commit(ctx, []kv.Op{kv.Put([]byte("w"), []byte("v"))}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		w    Witness
		want error
	}{
		{"written", Witness{Key: []byte("w"), Value: []byte("v")}, nil},
		{"other value", Witness{Key: []byte("w"), Value: []byte("x")}, ErrNotApplied},
		{"absent", Witness{Key: []byte("nope"), Value: []byte("v")}, ErrNotApplied},
		{"removed", Witness{Key: []byte("nope"), Removed: true}, nil},
		{"not removed", Witness{Key: []byte("w"), Removed: true}, ErrNotApplied},
	}
	for _, tc := range cases {
		// Each read-back first meets two failing reads.
		s.FailGets(kvfault.Fault{Err: errors.New("flaky")}, kvfault.Fault{Err: errors.New("flaky")})
		if err := Resolve(ctx, s, tc.w, Options{MaxBackoff: time.Millisecond}); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	s.Partition(errors.New("down"))
	if err := Resolve(cctx, s, Witness{Key: []byte("w")}, Options{MaxBackoff: time.Millisecond}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("store down: %v", err)
	}
}
