package kv

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// batches is a Scanner over fixed batches; closed counts its iterators'
// Close calls.
type batches struct {
	b      [][]Pair
	closed int
}

func (s *batches) Scan(context.Context, ScanOptions) (Iterator, error) {
	return &batchIter{s: s}, nil
}

type batchIter struct {
	s *batches
	i int
}

func (it *batchIter) Next(context.Context) ([]Pair, error) {
	if it.i == len(it.s.b) {
		return nil, nil
	}
	it.i++
	return it.s.b[it.i-1], nil
}

func (it *batchIter) Close() error { it.s.closed++; return nil }

func TestScanEach(t *testing.T) {
	pair := func(k string) Pair { return Pair{Key: []byte(k)} }
	s := &batches{b: [][]Pair{{pair("a"), pair("b")}, {pair("c")}}}
	var seen string
	collect := func(stop string, err error) func(Pair) error {
		return func(p Pair) error {
			seen += string(p.Key)
			if string(p.Key) == stop {
				return err
			}
			return nil
		}
	}
	boom := errors.New("boom")
	for _, c := range []struct {
		stop    string
		stopErr error
		want    string
		wantErr error
	}{
		{"", nil, "abc", nil},
		{"b", SkipRest, "ab", nil},
		{"b", fmt.Errorf("wrapped: %w", SkipRest), "ab", nil},
		{"c", boom, "abc", boom},
	} {
		seen, s.closed = "", 0
		err := ScanEach(context.Background(), s, ScanOptions{}, collect(c.stop, c.stopErr))
		if seen != c.want || !errors.Is(err, c.wantErr) || (c.wantErr == nil && err != nil) || s.closed != 1 {
			t.Errorf("stop at %q with %v: saw %q, %v, %d closes; want %q, %v, 1", c.stop, c.stopErr, seen, err, s.closed, c.want, c.wantErr)
		}
	}
}
