package tikv_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvtest"
	"github.com/engramkv/engram/engines/tikv"
	"github.com/engramkv/engram/engines/tikv/tikvmock"
)

func openMock(t testing.TB, opts tikvmock.Options) *tikv.Store {
	t.Helper()
	s, err := tikvmock.Open(opts)
	if err != nil {
		t.Fatalf("tikvmock.Open: %v", err)
	}
	return s
}

// TestConformance runs the adaptor contract on a mock cluster of ten
// regions, in the default namespace.
func TestConformance(t *testing.T) {
	kvtest.Run(t, func(t *testing.T) kv.Store { return openMock(t, tikvmock.Options{}) })
}

// TestConformanceBinaryPrefix runs the cases that exercise key bounds
// again, in a namespace whose end is not the prefix with its last byte
// incremented ("\xfe\xff" ends at "\xff"), so an off-by-one in the bounds
// the adaptor computes shows up. (The other cases do not depend on the
// prefix; running them twice would only double the time under -race.)
func TestConformanceBinaryPrefix(t *testing.T) {
	bounds := map[string]bool{
		"GetAbsentAndPresent": true, "ByteOrder": true, "ScanBoundsAndLimits": true, "EmptyRanges": true,
		"LargeValuesAndLongKeys": true, "ConditionalConflicts": true, "ReadYourWrites": true, "Partitions": true,
	}
	for _, c := range kvtest.Cases(kvtest.Config{}) {
		if !bounds[c.Name] {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			s := openMock(t, tikvmock.Options{Store: tikv.Options{Prefix: []byte("\xfe\xff")}})
			defer func() {
				if err := s.Close(); err != nil && !errors.Is(err, kv.ErrClosed) {
					t.Errorf("Close: %v", err)
				}
			}()
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			c.Run(ctx, t, s)
		})
	}
}

// TestConformanceUnderChurn runs the adaptor contract while the mock
// cluster changes under it: every 5th request first splits a region,
// merges two or moves a leader (tikvmock.Options.Churn), and PD learns of
// each change only 5 requests later, so reads, scans and commits meet the
// EpochNotMatch, region-miss and NotLeader answers of a real cluster under
// PD's scheduling, and PD's stale answers between a change and the
// region's next heartbeat.
func TestConformanceUnderChurn(t *testing.T) {
	var st tikvmock.ChurnStats
	kvtest.Run(t, func(t *testing.T) kv.Store {
		return openMock(t, tikvmock.Options{Churn: tikvmock.ChurnOptions{Every: 5, PDLag: 5, Stats: &st}})
	})
	t.Logf("churn: %v", &st)
	if st.Splits.Load() == 0 || st.Merges.Load() == 0 || st.LeaderMoves.Load() == 0 || st.NotLeader.Load() == 0 || st.EpochNotMatch.Load() == 0 || st.StaleRegionAnswers.Load() == 0 {
		t.Error("the churn did not exercise splits, merges, leader moves and PD's lag, or the client never met their errors")
	}
}
