package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/engramkv/engram/core/mvcc"
)

func (p CompactionPolicy) validate() error {
	switch p.Mode {
	case "":
	case "periodic":
		if p.Retention <= 0 {
			return fmt.Errorf("server: compaction.mode periodic needs a positive compaction.retention, got %v", p.Retention)
		}
	case "revision":
		if p.Revisions <= 0 {
			return fmt.Errorf("server: compaction.mode revision needs a positive compaction.revisions, got %d", p.Revisions)
		}
	default:
		return fmt.Errorf("server: unknown compaction.mode %q (want \"\", \"periodic\" or \"revision\")", p.Mode)
	}
	return nil
}

// runCompactionPolicy compacts on a schedule. It never races kube-apiserver's
// own compactor: both only ever move the compacted revision forward, a target
// at or below the current compacted revision is skipped, and ErrCompacted
// from a concurrent compaction is expected, not an error.
func (s *Server) runCompactionPolicy(ctx context.Context, backend *mvcc.Backend) {
	p := s.opts.Compaction
	interval := p.Interval
	if interval <= 0 {
		switch p.Mode {
		case "periodic":
			interval = min(max(p.Retention/10, time.Second), time.Hour)
		default:
			interval = 5 * time.Minute
		}
	}
	// For "periodic", remember the revision at each tick and compact to the
	// newest one that is at least Retention old.
	type sample struct {
		at  time.Time
		rev int64
	}
	var samples []sample
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			var target int64
			switch p.Mode {
			case "periodic":
				samples = append(samples, sample{now, backend.Rev()})
				i := 0
				for i+1 < len(samples) && now.Sub(samples[i+1].at) >= p.Retention {
					i++
				}
				samples = samples[i:]
				if now.Sub(samples[0].at) >= p.Retention {
					target = samples[0].rev
				}
			case "revision":
				target = backend.Rev() - p.Revisions
			}
			if target <= backend.CompactRev() || target <= 1 {
				continue
			}
			if _, err := backend.Compact(ctx, target, false); err != nil && !errors.Is(err, mvcc.ErrCompacted) {
				s.log.Warn("scheduled compaction failed", "target", target, "err", err)
				continue
			}
			s.log.Info("scheduled compaction", "mode", p.Mode, "revision", target)
		}
	}
}
