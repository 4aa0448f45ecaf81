// Package compaction owns Engram's optional server-side compaction policy:
// when to compact, never how. The mechanism (recording the compacted
// revision, removing history) belongs to package mvcc (DESIGN.md,
// "Compaction's rule"), as in etcd the compactor is separate from the store
// it compacts.
//
// The policy is off by default because kube-apiserver compacts by itself
// (every --etcd-compaction-interval, through the compact_rev_key transaction
// and the Compact RPC). When an operator turns it on it never races the
// apiserver's compactor: both only move the compacted revision forward, a
// target at or below the current compacted revision is skipped, and "already
// compacted" from a concurrent compaction is expected, not an error.
package compaction

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/engramkv/engram/core/internal/clock"
)

// Modes.
const (
	Off      = ""
	Periodic = "periodic"
	Revision = "revision"
)

// Policy is a compaction schedule.
type Policy struct {
	// Mode is Off, Periodic or Revision.
	Mode string
	// Retention is the history kept in Periodic mode: each run compacts to
	// the revision the store had Retention ago.
	Retention time.Duration
	// Revisions is the number of revisions kept in Revision mode.
	Revisions int64
	// Interval is how often the policy runs; 0 derives it from the mode
	// (Retention/10 between 1 s and 1 h for Periodic, 5 minutes for
	// Revision).
	Interval time.Duration
}

// Validate reports a policy that cannot run, naming the setting.
func (p Policy) Validate() error {
	switch p.Mode {
	case Off:
	case Periodic:
		if p.Retention <= 0 {
			return fmt.Errorf("compaction: mode periodic needs a positive retention, got %v", p.Retention)
		}
	case Revision:
		if p.Revisions <= 0 {
			return fmt.Errorf("compaction: mode revision needs a positive number of revisions, got %d", p.Revisions)
		}
	default:
		return fmt.Errorf("compaction: unknown mode %q (want \"\", %q or %q)", p.Mode, Periodic, Revision)
	}
	return nil
}

func (p Policy) interval() time.Duration {
	if p.Interval > 0 {
		return p.Interval
	}
	if p.Mode == Periodic {
		return min(max(p.Retention/10, time.Second), time.Hour)
	}
	return 5 * time.Minute
}

// Target is what the policy compacts.
type Target interface {
	Rev() int64
	CompactRev() int64
	// Compact compacts below rev; it fails with a value satisfying
	// IsCompacted when rev is already compacted.
	Compact(ctx context.Context, rev int64, wait bool) (int64, error)
}

// Run applies the policy to t until ctx ends, running it every interval on
// clk. isCompacted recognises t's "already compacted" error.
func (p Policy) Run(ctx context.Context, clk clock.Clock, t Target, isCompacted func(error) bool, log *slog.Logger) {
	if p.Mode == Off {
		return
	}
	tick := clk.NewTicker(p.interval())
	defer tick.Stop()
	var s sampler
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C():
			target := p.target(&s, now, t.Rev())
			if target <= t.CompactRev() || target <= 1 {
				continue
			}
			if _, err := t.Compact(ctx, target, false); err != nil {
				if !isCompacted(err) && !errors.Is(err, context.Canceled) {
					log.Warn("scheduled compaction failed", "target", target, "err", err)
				}
				continue
			}
			log.Info("scheduled compaction", "mode", p.Mode, "revision", target)
		}
	}
}

// target returns the revision to compact to at now, given the current rev.
func (p Policy) target(s *sampler, now time.Time, rev int64) int64 {
	switch p.Mode {
	case Periodic:
		return s.observe(now, rev, p.Retention)
	case Revision:
		return rev - p.Revisions
	}
	return 0
}

// sampler remembers the revision at each run, to find the newest revision
// that is at least Retention old.
type sampler struct {
	samples []sample
}

type sample struct {
	at  time.Time
	rev int64
}

func (s *sampler) observe(now time.Time, rev int64, retention time.Duration) int64 {
	s.samples = append(s.samples, sample{now, rev})
	i := 0
	for i+1 < len(s.samples) && now.Sub(s.samples[i+1].at) >= retention {
		i++
	}
	s.samples = s.samples[i:]
	if now.Sub(s.samples[0].at) >= retention {
		return s.samples[0].rev
	}
	return 0
}
