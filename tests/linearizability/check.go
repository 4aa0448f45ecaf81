// Package linearizability checks that Engram behaves as a linearizable etcd
// under concurrent clients, crashes, failovers and store partitions, as
// etcd's own robustness tests do.
//
// A run records every operation of concurrent clients (History: call and
// return time, request, response with its header revision), a watcher's
// events over the whole key set, and read-backs after each restart. Check
// then verifies:
//
//   - linearizability: porcupine searches for an order of the operations
//     that respects real time and etcd's KV semantics (Model: a global
//     revision that every change advances by one, per-key create and mod
//     revisions and versions, compare-and-swap, deletes that change nothing
//     when the key is absent), with every response's header revision
//     matched against the model's;
//   - the watch: every revision once, in order, with no gap from the first
//     write to the final revision, resumed from the last revision + 1 after
//     every disconnect; events that replay to consistent versions; every
//     acknowledged write's event at its revision; every value written at
//     most once;
//   - read-backs: every write acknowledged before a read-back is visible in
//     it (its value, or a later write of its key).
//
// A write whose outcome the client never learned (an error or a timeout)
// is pending: porcupine may place it anywhere after its call. When the watch
// is complete it resolves them first: a write whose unique value appears in
// the watch took effect at that revision, no later than the watcher saw it;
// one that does not appear never took effect and is dropped. Failed reads
// are not recorded.
//
// The checker has its own tests with planted bugs (a stale read, a lost
// write, a duplicated watch event, a revision gap) that it must report; the
// runs (*_test.go) drive real and in-process servers, among them a rolling
// upgrade from the previous release's processes to this build's
// (upgrade_test.go).
package linearizability

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Options tune Check.
type Options struct {
	// Timeout bounds porcupine's search; an undecided search is a failure
	// ("could not decide"), never a pass. Zero means 2 minutes.
	Timeout time.Duration
	// VisualizePath, when set, is where porcupine's HTML visualization of
	// a non-linearizable history is written.
	VisualizePath string
}

// Stats count what a history held and what the checker did with it.
type Stats struct {
	Ops, Reads, Writes, Acknowledged int
	// Unknown writes: resolved as applied by the watch, dropped as never
	// applied, and left pending for porcupine.
	Unknown, ResolvedApplied, ResolvedDropped, Pending int
	// Assumed: unknown writes dropped though the watch, which has a gap or
	// ended early, cannot show they never took effect.
	Assumed               int
	Readbacks             int
	Events, WatchRestarts int
	MaxRev                int64
}

func (s Stats) String() string {
	return fmt.Sprintf("%d ops (%d reads, %d writes, %d acknowledged writes, %d read-backs), %d unknown writes (%d applied per the watch, %d dropped, %d left pending), %d watch events (%d watch restarts), max revision %d",
		s.Ops, s.Reads, s.Writes, s.Acknowledged, s.Readbacks, s.Unknown, s.ResolvedApplied, s.ResolvedDropped, s.Pending, s.Events, s.WatchRestarts, s.MaxRev)
}

// Result is Check's verdict.
type Result struct {
	// Linearizable is porcupine's answer: Ok, Illegal, or Unknown (the
	// search ran out of time: a failure).
	Linearizable porcupine.CheckResult
	// CheckTime is how long porcupine took.
	CheckTime time.Duration
	// Problems are the violations found, each with its history excerpt;
	// a non-linearizable history's explanation is among them.
	Problems []string
	Stats    Stats
}

// OK reports whether the history passed every check.
func (r Result) OK() bool { return r.Linearizable == porcupine.Ok && len(r.Problems) == 0 }

// Check verifies a recorded history; see the package documentation.
func Check(h History, opts Options) Result {
	if opts.Timeout == 0 {
		opts.Timeout = 2 * time.Minute
	}
	var res Result
	res.Stats.Events = len(h.Watch)
	if len(h.WatchStarts) > 0 {
		res.Stats.WatchRestarts = len(h.WatchStarts) - 1
	}
	problem := func(format string, args ...any) { res.Problems = append(res.Problems, fmt.Sprintf(format, args...)) }

	for _, op := range h.Ops {
		res.Stats.Ops++
		if op.Readback {
			res.Stats.Readbacks++
		}
		if op.Req.Kind.IsWrite() {
			res.Stats.Writes++
			if op.Resp.Unknown {
				res.Stats.Unknown++
			}
			if _, ok := op.Acknowledged(); ok {
				res.Stats.Acknowledged++
			}
		} else {
			res.Stats.Reads++
		}
		if !op.Resp.Unknown && op.Resp.Rev > res.Stats.MaxRev {
			res.Stats.MaxRev = op.Resp.Rev
		}
		if op.Return < op.Call {
			problem("malformed history: returns before its call: %s", op)
		}
		if op.Req.Kind != Range && (op.Req.Key < 0 || op.Req.Key >= NumKeys) {
			problem("malformed history: key out of range: %s", op)
		}
	}

	res.Problems = append(res.Problems, checkWatch(h)...)
	res.Problems = append(res.Problems, checkReadbacks(h)...)

	ops := resolveUnknown(h, true, &res)

	var info *porcupine.LinearizationInfo
	res.Linearizable, res.CheckTime, info = linearize(ops, opts.Timeout)
	switch res.Linearizable {
	case porcupine.Illegal:
		explanation := explain(ops, *info)
		if res.Stats.Assumed > 0 {
			explanation = fmt.Sprintf("(assuming %d unknown writes the incomplete watch does not show never took effect) %s", res.Stats.Assumed, explanation)
		}
		problem("%s", explanation)
		if opts.VisualizePath != "" {
			if err := porcupine.VisualizePath(Model(), *info, opts.VisualizePath); err == nil {
				problem("porcupine's visualization of the history: %s", opts.VisualizePath)
			}
		}
	case porcupine.Unknown:
		problem("could not decide linearizability of %d operations within %v: treat as a failure (shorten the run or raise the timeout)", len(ops), opts.Timeout)
	}
	return res
}

func operations(ops []Op) []porcupine.Operation {
	history := make([]porcupine.Operation, len(ops))
	for i, op := range ops {
		history[i] = porcupine.Operation{ClientId: op.Client, Input: op.Req, Call: op.Call, Output: op.Resp, Return: op.Return, Metadata: op.Note}
	}
	return history
}

// linearize runs porcupine on ops; for an illegal history it searches
// again, keeping the longest partial orders (what explain and the
// visualization show).
func linearize(ops []Op, timeout time.Duration) (porcupine.CheckResult, time.Duration, *porcupine.LinearizationInfo) {
	history := operations(ops)
	start := time.Now()
	verdict := porcupine.CheckOperationsTimeout(Model(), history, timeout)
	took := time.Since(start)
	if verdict != porcupine.Illegal {
		return verdict, took, nil
	}
	_, info := porcupine.CheckOperationsVerbose(Model(), history, timeout)
	return verdict, took, &info
}

// Summary is a one-paragraph report of r.
func (r Result) Summary() string {
	verdict := "PASS"
	if !r.OK() {
		verdict = fmt.Sprintf("FAIL (%d problems)", len(r.Problems))
	}
	return fmt.Sprintf("%s: linearizability %s in %v; %s", verdict, r.Linearizable, r.CheckTime.Round(time.Millisecond), r.Stats)
}

// checkWatch checks the watcher's events against the watch guarantees and
// the acknowledged writes.
func checkWatch(h History) []string {
	var problems []string
	problem := func(format string, args ...any) {
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	if len(h.WatchStarts) == 0 {
		return []string{"watch: the watcher never started"}
	}
	if first := h.WatchStarts[0].FromRev; first > 2 {
		problem("watch: the first watch started from rev %d, not from the beginning (rev 1 or 2)", first)
	}
	// Each resume asks for the revision after the last one received.
	for i := 1; i < len(h.WatchStarts); i++ {
		prev, ws := h.WatchStarts[i-1], h.WatchStarts[i]
		want := prev.FromRev // nothing received since the previous start
		if ws.After > prev.After {
			want = h.Watch[ws.After-1].Rev() + 1
		}
		if ws.FromRev != want {
			kind := "a duplicate"
			if ws.FromRev > want {
				kind = "a gap"
			}
			problem("watch: restart %d at %.4fs resumed from rev %d, but the next revision due was %d (%s)",
				i, seconds(ws.At), ws.FromRev, want, kind)
		}
	}

	// Revisions in order, each once, dense from 2: every change in a run is
	// a single-key write under the watched prefix, so each revision has
	// exactly one event.
	var state [NumKeys]KeyValue
	byValue := map[string]WatchEvent{}
	next := int64(2)
	for i, ev := range h.Watch {
		rev := ev.Rev()
		switch {
		case rev < next:
			problem("watch: event %d %s is a duplicate or out of order: rev %d was due (previous event: %s)", i, ev, next, prevEvent(h.Watch, i))
			continue
		case rev > next:
			problem("watch: gap: revisions %d..%d missing before event %d %s", next, rev-1, i, ev)
		}
		next = rev + 1
		if ev.Key < 0 || ev.Key >= NumKeys {
			problem("watch: event %d on a key outside the set: %s", i, ev)
			continue
		}
		prev := state[ev.Key]
		switch ev.Type {
		case EventPut:
			want := KeyValue{Value: ev.KV.Value, Create: rev, Mod: rev, Version: 1}
			if prev.Exists() {
				want.Create, want.Version = prev.Create, prev.Version+1
			}
			if ev.KV != want {
				problem("watch: event %s does not follow from the key's previous event (%s): want %s", ev, prev, want)
			}
			if first, dup := byValue[ev.KV.Value]; dup {
				problem("watch: value %q written twice: %s and %s", ev.KV.Value, first, ev)
			}
			byValue[ev.KV.Value] = ev
			state[ev.Key] = ev.KV
		case EventDelete:
			if !prev.Exists() {
				problem("watch: event %s deletes an absent key", ev)
			}
			state[ev.Key] = KeyValue{}
		}
	}
	last := next - 1

	// The watch reached the end of the history, and every acknowledged
	// write is in it at its revision.
	var maxAcked int64
	byRev := make(map[int64]WatchEvent, len(h.Watch))
	for _, ev := range h.Watch {
		if _, seen := byRev[ev.Rev()]; !seen {
			byRev[ev.Rev()] = ev
		}
	}
	missing := 0
	for _, op := range h.Ops {
		rev, ok := op.Acknowledged()
		if !ok {
			continue
		}
		maxAcked = max(maxAcked, rev)
		if rev > last {
			continue
		}
		ev, seen := byRev[rev]
		switch {
		case !seen:
			if missing++; missing <= 5 {
				problem("watch: acknowledged write missing from the watch: %s", op)
			}
		case ev.Key != op.Req.Key,
			op.Req.Kind == Delete && ev.Type != EventDelete,
			op.Req.Kind != Delete && (ev.Type != EventPut || ev.KV.Value != op.Req.Value):
			problem("watch: acknowledged write %s, but the watch shows %s at its revision", op, ev)
		}
	}
	if target := max(maxAcked, h.FinalRev); last < target {
		problem("watch: the watcher reached rev %d only; writes were acknowledged up to rev %d and the final read-back was at rev %d", last, maxAcked, h.FinalRev)
	} else if !h.WatchComplete {
		problem("watch: the watcher did not finish cleanly")
	}

	// Every put event is a value some client wrote, to that key.
	written := map[string]int{}
	for _, op := range h.Ops {
		if op.Req.Kind == Put || op.Req.Kind == CAS {
			written[op.Req.Value] = op.Req.Key
		}
	}
	for _, ev := range h.Watch {
		if k, ok := written[ev.KV.Value]; ev.Type == EventPut && (!ok || k != ev.Key) {
			problem("watch: event %s carries a value no client wrote to that key", ev)
			break
		}
	}
	// Every deletion comes from a Delete of its key: acknowledged at that
	// revision, or unknown and issued before the event arrived.
	ackedDelete := map[int64]int{}
	for _, op := range h.Ops {
		if rev, ok := op.Acknowledged(); ok && op.Req.Kind == Delete {
			ackedDelete[rev] = op.Req.Key
		}
	}
	for _, ev := range h.Watch {
		if ev.Type != EventDelete {
			continue
		}
		if k, ok := ackedDelete[ev.Rev()]; ok && k == ev.Key {
			continue
		}
		issued := false
		for _, op := range h.Ops {
			if op.Req.Kind == Delete && op.Resp.Unknown && op.Req.Key == ev.Key && op.Call <= ev.Recv {
				issued = true
				break
			}
		}
		if !issued {
			problem("watch: event %s deletes a key no client was deleting", ev)
			break
		}
	}
	return problems
}

func prevEvent(evs []WatchEvent, i int) string {
	if i == 0 {
		return "none"
	}
	return evs[i-1].String()
}

// checkReadbacks checks that every write acknowledged before a read-back
// is visible in it.
func checkReadbacks(h History) []string {
	var problems []string
	// Deletions known by revision, per key: acknowledged ones and those
	// the watch saw.
	deletedAt := make([]map[int64]bool, NumKeys)
	for k := range deletedAt {
		deletedAt[k] = map[int64]bool{}
	}
	for _, op := range h.Ops {
		if rev, ok := op.Acknowledged(); ok && op.Req.Kind == Delete {
			deletedAt[op.Req.Key][rev] = true
		}
	}
	for _, ev := range h.Watch {
		if ev.Type == EventDelete && ev.Key >= 0 && ev.Key < NumKeys {
			deletedAt[ev.Key][ev.Rev()] = true
		}
	}
	deletedBetween := func(k int, from, to int64) bool {
		for rev := range deletedAt[k] {
			if rev > from && rev <= to {
				return true
			}
		}
		return false
	}
	for _, rb := range h.Ops {
		if !rb.Readback || rb.Resp.Unknown {
			continue
		}
		// The latest write to each key acknowledged before the read-back
		// was issued.
		var latest [NumKeys]*Op
		for i := range h.Ops {
			op := &h.Ops[i]
			rev, ok := op.Acknowledged()
			if !ok || op.Return >= rb.Call {
				continue
			}
			if rev > rb.Resp.Rev {
				problems = append(problems, fmt.Sprintf("read-back: %s was acknowledged before the read-back %s, at a revision it does not reach", op, rb))
				continue
			}
			if l := latest[op.Req.Key]; l == nil || l.Resp.Rev < rev {
				latest[op.Req.Key] = op
			}
		}
		for k, w := range latest {
			if w == nil {
				continue
			}
			got, rev := rb.Resp.All[k], w.Resp.Rev
			lost := false
			switch {
			case got.Mod > rev:
				// Overwritten later.
			case got.Mod == rev:
				lost = w.Req.Kind == Delete || got.Value != w.Req.Value
			case w.Req.Kind == Delete:
				lost = got.Exists()
			default:
				lost = got.Exists() || !deletedBetween(k, rev, rb.Resp.Rev)
			}
			if lost {
				problems = append(problems, fmt.Sprintf("read-back: lost write: %s acknowledged before the read-back, which shows k%d=%s: %s", w, k, got, rb))
			}
		}
	}
	return problems
}

// maxPending is how many unknown writes the watch could not resolve that
// Check leaves pending.
const maxPending = 8

// resolveUnknown returns the operations to check, with the unknown writes
// resolved by the watch where it can tell, and left pending where it
// cannot. With useWatch false every unknown write stays pending.
//
// A Put or CAS whose unique value is in the watch took effect at that
// event's revision, no later than the watcher received it. A Delete carries
// no value, but every delete of a key has the same effect, so each deletion
// the watch saw that no acknowledged Delete accounts for is attributed to an
// unknown Delete of that key issued before the event arrived (any such one
// does). A write the watch does not show did not take effect (or, for a
// Delete or CAS, took effect without changing anything) and is dropped,
// unless the watch has a gap, or ends, after the write was issued: then it
// may have taken effect at a revision the watch missed, and stays pending.
// Porcupine's search grows exponentially with pending writes, so when more
// than maxPending would stay pending, they are dropped too (the watch
// problem already fails the run) and res.Stats.Assumed counts them.
func resolveUnknown(h History, useWatch bool, res *Result) []Op {
	// blind[i]: when the watch stopped seeing revisions (a gap, or its
	// end before the final revision), as the receive time of the next
	// event (Pending: never). An unknown write issued before one of these
	// may hide in it.
	var blind []int64
	byValue := map[string]WatchEvent{}
	deletes := make([][]WatchEvent, NumKeys) // unexplained, by key, in order
	if useWatch {
		ackedDeletes := map[int64]bool{}
		target := h.FinalRev
		for _, op := range h.Ops {
			if rev, ok := op.Acknowledged(); ok {
				target = max(target, rev)
				if op.Req.Kind == Delete {
					ackedDeletes[rev] = true
				}
			}
		}
		next := int64(2)
		for _, ev := range h.Watch {
			if ev.Rev() < next {
				continue // a duplicate; reported by checkWatch
			}
			if ev.Rev() > next {
				blind = append(blind, ev.Recv)
			}
			next = ev.Rev() + 1
			switch {
			case ev.Type == EventPut:
				byValue[ev.KV.Value] = ev
			case ev.Key >= 0 && ev.Key < NumKeys && !ackedDeletes[ev.Rev()]:
				deletes[ev.Key] = append(deletes[ev.Key], ev)
			}
		}
		if next <= target || !h.WatchComplete {
			blind = append(blind, Pending)
		}
	} else {
		blind = []int64{Pending}
	}
	hidden := 0
	for _, op := range h.Ops {
		if _, found := byValue[op.Req.Value]; op.Resp.Unknown && !(found && op.Req.Kind != Delete) {
			for _, at := range blind {
				if at >= op.Call {
					hidden++
					break
				}
			}
		}
	}
	assume := useWatch && hidden > maxPending
	mayHide := func(op Op) bool {
		for _, at := range blind {
			if at >= op.Call {
				if assume {
					res.Stats.Assumed++
					return false
				}
				return true
			}
		}
		return false
	}

	out := make([]Op, 0, len(h.Ops))
	var unknownDeletes [NumKeys][]int // indexes into out
	for _, op := range h.Ops {
		if !op.Resp.Unknown {
			out = append(out, op)
			continue
		}
		op.Return, op.Resp = Pending, Response{Unknown: true}
		switch op.Req.Kind {
		case Put, CAS:
			if ev, applied := byValue[op.Req.Value]; applied && ev.Key == op.Req.Key {
				op.Resp = Response{Unknown: true, Rev: ev.Rev(), Succeeded: op.Req.Kind == CAS}
				op.Return = max(ev.Recv, op.Call)
				res.Stats.ResolvedApplied++
			} else if !mayHide(op) {
				res.Stats.ResolvedDropped++
				continue
			}
		case Delete:
			unknownDeletes[op.Req.Key] = append(unknownDeletes[op.Req.Key], len(out))
		}
		out = append(out, op)
	}
	// Deletions: in event order, each to the earliest issued unknown Delete
	// of its key not yet used that was issued before the event arrived.
	drop := map[int]bool{}
	for k, evs := range deletes {
		cands := unknownDeletes[k]
		sort.Slice(cands, func(a, b int) bool { return out[cands[a]].Call < out[cands[b]].Call })
		used := make([]bool, len(cands))
		for _, ev := range evs {
			for c, i := range cands {
				if !used[c] && out[i].Call <= ev.Recv {
					used[c] = true
					out[i].Resp.Rev = ev.Rev()
					out[i].Return = max(ev.Recv, out[i].Call)
					res.Stats.ResolvedApplied++
					break
				}
			}
		}
		for c, i := range cands {
			if !used[c] && !mayHide(out[i]) {
				drop[i] = true
				res.Stats.ResolvedDropped++
			}
		}
	}
	kept := out[:0]
	for i, op := range out {
		if drop[i] {
			continue
		}
		if op.Return == Pending {
			res.Stats.Pending++
		}
		kept = append(kept, op)
	}
	return kept
}

// explain describes where a non-linearizable history breaks: the longest
// order porcupine found, the state it leads to, and the operations that
// cannot follow it.
func explain(ops []Op, info porcupine.LinearizationInfo) string {
	var longest []int
	for _, partition := range info.PartialLinearizations() {
		for _, lin := range partition {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
	}
	state := InitialState()
	done := make([]bool, len(ops))
	for _, id := range longest {
		_, state = Step(state, ops[id].Req, ops[id].Resp)
		done[id] = true
	}
	var b strings.Builder
	fmt.Fprintf(&b, "not linearizable: the longest valid order covers %d of %d operations.\n", len(longest), len(ops))
	from := max(0, len(longest)-8)
	fmt.Fprintf(&b, "  last operations of that order:\n")
	for _, id := range longest[from:] {
		fmt.Fprintf(&b, "    %s\n", ops[id])
	}
	fmt.Fprintf(&b, "  state after them: %s\n", state)
	// The operations that must come next: those not yet placed, by return
	// time; the first of them could not be placed anywhere.
	var rest []int
	for i := range ops {
		if !done[i] {
			rest = append(rest, i)
		}
	}
	sort.Slice(rest, func(a, b int) bool { return ops[rest[a]].Return < ops[rest[b]].Return })
	fmt.Fprintf(&b, "  operations that cannot follow (earliest return first):\n")
	for _, id := range rest[:min(len(rest), 6)] {
		ok, _ := Step(state, ops[id].Req, ops[id].Resp)
		fmt.Fprintf(&b, "    %s (possible next: %v)\n", ops[id], ok)
	}
	return b.String()
}

// WriteHistory writes h as text to path, for a failure's artifacts.
func WriteHistory(h History, path string) error {
	var b strings.Builder
	ops := append([]Op(nil), h.Ops...)
	sort.Slice(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	for _, op := range ops {
		fmt.Fprintf(&b, "%s\n", op)
	}
	fmt.Fprintf(&b, "\nwatch starts:\n")
	for _, ws := range h.WatchStarts {
		fmt.Fprintf(&b, "[%.4fs] from rev %d after %d events\n", seconds(ws.At), ws.FromRev, ws.After)
	}
	fmt.Fprintf(&b, "\nwatch events:\n")
	for _, ev := range h.Watch {
		fmt.Fprintf(&b, "%s\n", ev)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
