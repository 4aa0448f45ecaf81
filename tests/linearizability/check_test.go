package linearizability

import (
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

func correct(seed int64) synthOptions {
	return synthOptions{Clients: 8, Ops: 400, Seed: seed, Unknown: 0.05, Readbacks: 3, LoseKey: -1}
}

// requireProblem checks that res failed with a problem mentioning want.
func requireProblem(t *testing.T, res Result, want string) {
	t.Helper()
	if res.OK() {
		t.Fatalf("the checker accepted a history with a planted bug: %s", res.Summary())
	}
	for _, p := range res.Problems {
		if strings.Contains(p, want) {
			t.Logf("reported: %s", p)
			return
		}
	}
	t.Fatalf("no problem mentions %q; got:\n%s", want, strings.Join(res.Problems, "\n"))
}

func TestCheckerAcceptsCorrectHistories(t *testing.T) {
	for seed := range int64(5) {
		s := synthesize(correct(seed))
		res := Check(s.History, Options{})
		if !res.OK() {
			t.Fatalf("seed %d: a correct history failed: %s\n%s", seed, res.Summary(), strings.Join(res.Problems, "\n"))
		}
		if res.Stats.ResolvedApplied == 0 || res.Stats.ResolvedDropped == 0 || res.Stats.Readbacks != 3 {
			t.Fatalf("seed %d: the history does not exercise unknown writes and read-backs: %s", seed, res.Stats)
		}
		t.Logf("seed %d: %s", seed, res.Summary())
	}
}

// TestCheckerPendingWrites checks a history with unknown writes the watch
// did not resolve (some took effect, some did not): porcupine must place
// them on its own.
func TestCheckerPendingWrites(t *testing.T) {
	s := synthesize(correct(7))
	var res Result
	ops := resolveUnknown(s.History, true, &res)
	pending := 0
	for i := range ops {
		if ops[i].Resp.Unknown && pending < maxPending {
			ops[i].Return, ops[i].Resp = Pending, Response{Unknown: true}
			pending++
		}
	}
	if pending < maxPending {
		t.Fatalf("only %d unknown writes", pending)
	}
	start := time.Now()
	if got, _, _ := linearize(ops, time.Minute); got != porcupine.Ok {
		t.Fatalf("with %d pending writes: %s", pending, got)
	}
	t.Logf("%d operations with %d pending writes checked in %v", len(ops), pending, time.Since(start))
}

// TestCheckerStaleRead plants a read that answers from before a write
// which completed before the read was issued.
func TestCheckerStaleRead(t *testing.T) {
	s := synthesize(correct(1))
	for i, g := range s.Ops {
		if g.Req.Kind != Get {
			continue
		}
		for j, w := range s.Ops[:i] {
			rev, ok := w.Acknowledged()
			if !ok || w.Req.Kind != Put || w.Req.Key != g.Req.Key || w.Return >= g.Call || g.Resp.Rev-rev > 20 {
				continue
			}
			old := s.Before[j]
			s.Ops[i].Resp = Response{Rev: old.Rev, KV: old.Keys[g.Req.Key]}
			t.Logf("planted: %s answers as before %s", s.Ops[i], w)
			requireProblem(t, Check(s.History, Options{}), "not linearizable")
			return
		}
	}
	t.Fatal("no read to make stale")
}

// TestCheckerRevisionRegression plants a bug the cluster runs once met: a
// read that returns a lower revision than a read another client completed
// before it began, though everything else about it is consistent.
func TestCheckerRevisionRegression(t *testing.T) {
	s := synthesize(correct(2))
	for i, late := range s.Ops {
		if late.Req.Kind != Get {
			continue
		}
		for _, early := range s.Ops[:i] {
			if early.Req.Kind != Get || early.Client == late.Client || early.Return >= late.Call || early.Resp.Rev != late.Resp.Rev {
				continue
			}
			// The late read answers from just before the last write at or
			// before its revision.
			for k := i - 1; k >= 0; k-- {
				if rev, ok := s.Ops[k].Acknowledged(); ok && rev == late.Resp.Rev {
					old := s.Before[k]
					s.Ops[i].Resp = Response{Rev: old.Rev, KV: old.Keys[late.Req.Key]}
					t.Logf("planted: %s after %s", s.Ops[i], early)
					requireProblem(t, Check(s.History, Options{}), "not linearizable")
					return
				}
			}
		}
	}
	t.Fatal("no pair of reads to plant the regression in")
}

// TestCheckerLostWrite plants a write acknowledged at a revision that the
// store never applied.
func TestCheckerLostWrite(t *testing.T) {
	o := correct(3)
	o.LoseKey, o.LoseAfter = 2, 0.6
	s := synthesize(o)
	res := Check(s.History, Options{})
	requireProblem(t, res, "not linearizable")
	requireProblem(t, res, "read-back: lost write")
	requireProblem(t, res, "but the watch shows")
}

// TestCheckerDuplicateWatchEvent plants an event delivered twice.
func TestCheckerDuplicateWatchEvent(t *testing.T) {
	s := synthesize(correct(4))
	i := len(s.Watch) / 2
	s.Watch = append(s.Watch[:i+1], s.Watch[i:]...)
	requireProblem(t, Check(s.History, Options{}), "is a duplicate or out of order")
}

// TestCheckerWatchGap plants a revision the watch skipped.
func TestCheckerWatchGap(t *testing.T) {
	s := synthesize(correct(5))
	i := len(s.Watch) / 2
	s.Watch = append(s.Watch[:i], s.Watch[i+1:]...)
	requireProblem(t, Check(s.History, Options{}), "watch: gap")
}

// TestCheckerWatchResumeGap plants a watcher that resumed after a
// disconnect from the revision after the one it should have asked for.
func TestCheckerWatchResumeGap(t *testing.T) {
	s := synthesize(correct(6))
	i := len(s.Watch) / 2
	s.WatchStarts = append(s.WatchStarts, WatchStart{At: s.Watch[i].Recv, FromRev: s.Watch[i].Rev() + 2, After: i + 1})
	s.Watch = append(s.Watch[:i+1], s.Watch[i+2:]...)
	res := Check(s.History, Options{})
	requireProblem(t, res, "(a gap)")
	requireProblem(t, res, "watch: gap")
}

// TestCheckerWatchIncomplete: a watcher that stopped before the final
// revision fails the run.
func TestCheckerWatchIncomplete(t *testing.T) {
	s := synthesize(correct(8))
	s.Watch = s.Watch[:len(s.Watch)-3]
	requireProblem(t, Check(s.History, Options{}), "the watcher reached rev")
}

// TestCheckerUndecided: a search that runs out of time fails the check.
func TestCheckerUndecided(t *testing.T) {
	o := correct(9)
	o.Ops = 2000
	s := synthesize(o)
	res := Check(s.History, Options{Timeout: time.Nanosecond})
	if res.Linearizable != porcupine.Unknown {
		t.Skipf("the search finished within a nanosecond: %s", res.Linearizable)
	}
	requireProblem(t, res, "could not decide")
}

// TestCheckerTiming measures porcupine on a history the size of a run
// (8 clients at 1,000 operations/s for 20 s) and bounds it.
func TestCheckerTiming(t *testing.T) {
	o := correct(10)
	o.Ops = 2500
	s := synthesize(o)
	res := Check(s.History, Options{})
	if !res.OK() {
		t.Fatalf("%s\n%s", res.Summary(), strings.Join(res.Problems, "\n"))
	}
	t.Logf("%s", res.Summary())
	if res.CheckTime > 30*time.Second {
		t.Errorf("checking %d operations took %v", res.Stats.Ops, res.CheckTime)
	}
}

// TestCheckerWriteAppliedTwice replays, in small, what
// TestClusterSharedStoreFaults recorded before core/internal/etcdapi
// stopped answering Canceled for a forwarded write cut by a leader change: the client resent the Put, which the old route had
// already applied, so one Put shows at two revisions and its answer names
// itself as the previous value.
func TestCheckerWriteAppliedTwice(t *testing.T) {
	ms := int64(time.Millisecond)
	h := History{
		Ops: []Op{
			{Client: 0, Call: 0, Return: 2 * ms, Req: Request{Kind: Put, Key: 1, Value: "c0-1"}, Resp: Response{Rev: 2}},
			{Client: 1, Call: 3 * ms, Return: 9 * ms, Req: Request{Kind: Put, Key: 1, Value: "c1-686"},
				Resp: Response{Rev: 4, KV: KeyValue{Value: "c1-686", Create: 2, Mod: 3, Version: 2}}},
			{Client: 2, Call: 10 * ms, Return: 11 * ms, Req: Request{Kind: Get, Key: 1},
				Resp: Response{Rev: 4, KV: KeyValue{Value: "c1-686", Create: 2, Mod: 4, Version: 3}}},
		},
		Watch: []WatchEvent{
			{Recv: 1 * ms, Type: EventPut, Key: 1, KV: KeyValue{Value: "c0-1", Create: 2, Mod: 2, Version: 1}},
			{Recv: 5 * ms, Type: EventPut, Key: 1, KV: KeyValue{Value: "c1-686", Create: 2, Mod: 3, Version: 2}},
			{Recv: 8 * ms, Type: EventPut, Key: 1, KV: KeyValue{Value: "c1-686", Create: 2, Mod: 4, Version: 3}},
		},
		WatchStarts:   []WatchStart{{FromRev: 1}},
		WatchComplete: true,
		FinalRev:      4,
	}
	res := Check(h, Options{})
	requireProblem(t, res, "written twice")
	requireProblem(t, res, "not linearizable")
}
