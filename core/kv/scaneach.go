package kv

import (
	"context"
	"errors"
)

// Scanner is what ScanEach reads: a Store, or a narrower view of one.
type Scanner interface {
	Scan(ctx context.Context, opts ScanOptions) (Iterator, error)
}

// SkipRest, returned by ScanEach's fn, ends the scan early; ScanEach then
// returns nil.
var SkipRest = errors.New("kv: skip the rest of the scan")

// ScanEach calls fn with every pair of a scan of s, in the scan's order,
// until the scan ends or fn returns an error, which ScanEach returns (nil
// for SkipRest). The pairs are the caller's to keep, as Next's are.
func ScanEach(ctx context.Context, s Scanner, opts ScanOptions, fn func(Pair) error) error {
	it, err := s.Scan(ctx, opts)
	if err != nil {
		return err
	}
	defer it.Close()
	for {
		batch, err := it.Next(ctx)
		if err != nil {
			return err
		}
		if len(batch) == 0 {
			return nil
		}
		for _, p := range batch {
			if err := fn(p); err != nil {
				if errors.Is(err, SkipRest) {
					return nil
				}
				return err
			}
		}
	}
}
