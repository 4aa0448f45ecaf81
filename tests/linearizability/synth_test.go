package linearizability

import (
	"fmt"
	"math/rand"
	"sort"
)

// synthOptions shape a synthetic history: concurrent clients against a
// sequential etcd, each operation taking effect at a random point of its
// interval, so the history is linearizable by construction (unless a bug is
// planted).
type synthOptions struct {
	Clients int
	Ops     int // per client
	Seed    int64
	// Unknown is the fraction of writes whose client sees an error; half
	// of them take effect anyway.
	Unknown float64
	// Readbacks is how many read-backs (full ranges) are spread over the
	// history.
	Readbacks int
	// LoseKey, when >= 0, plants a lost write: the first acknowledged Put
	// of that key after LoseAfter of the operations is acknowledged at a
	// revision but never applied (the next write reuses its revision), and
	// later writes of that key become reads, so the read-back at the end
	// still shows the old value.
	LoseKey   int
	LoseAfter float64
}

// synth is a synthetic history and what the generator knew.
type synth struct {
	History
	// Before is, for each operation (same index as History.Ops), the
	// store's state just before it took effect.
	Before []State
}

type synthOp struct {
	op      Op
	at      int64 // when it takes effect
	applied bool  // for unknown writes: whether it takes effect
}

func synthesize(o synthOptions) synth {
	rng := rand.New(rand.NewSource(o.Seed))
	ms := int64(1e6)
	var all []*synthOp
	for c := range o.Clients {
		t := rng.Int63n(2 * ms)
		for i := range o.Ops {
			req := Request{Key: rng.Intn(NumKeys)}
			switch r := rng.Intn(100); {
			case r < 35:
				req.Kind = Get
			case r < 60:
				req.Kind = Put
			case r < 80:
				req.Kind = CAS
			case r < 95:
				req.Kind = Delete
			default:
				req.Kind = Range
			}
			req.Value = fmt.Sprintf("c%d-%d", c, i)
			call := t
			at := call + rng.Int63n(3*ms)
			ret := at + rng.Int63n(3*ms)
			s := &synthOp{op: Op{Client: c, Call: call, Return: ret, Req: req}, at: at, applied: true}
			if req.Kind.IsWrite() && rng.Float64() < o.Unknown {
				s.op.Return = Pending
				s.op.Resp.Unknown = true
				s.applied = rng.Intn(2) == 0
			}
			all = append(all, s)
			t = ret + rng.Int63n(2*ms)
		}
	}
	end := int64(0)
	for _, s := range all {
		end = max(end, s.at)
	}
	for i := range o.Readbacks {
		at := end * int64(i+1) / int64(o.Readbacks)
		all = append(all, &synthOp{op: Op{Client: o.Clients, Call: at - ms, Return: at + ms, Req: Request{Kind: Range}, Readback: true}, at: at})
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].at < all[j].at })

	var (
		out      synth
		state    = InitialState()
		lastMod  = make([][NumKeys]int64, o.Clients+1)
		lost     = false
		loseFrom = int64(float64(end) * o.LoseAfter)
	)
	out.WatchStarts = []WatchStart{{At: 0, FromRev: 1}}
	recv := int64(0)
	emit := func(k int, typ EventType, kv KeyValue, at int64) {
		recv = max(recv, at+rng.Int63n(2*ms))
		out.Watch = append(out.Watch, WatchEvent{Recv: recv, Type: typ, Key: k, KV: kv})
	}
	for _, s := range all {
		op := &s.op
		req := &op.Req
		if o.LoseKey >= 0 && lost && req.Key == o.LoseKey && req.Kind.IsWrite() {
			*req = Request{Kind: Get, Key: req.Key}
			op.Return, op.Resp = s.at+ms, Response{}
		}
		if req.Kind == CAS {
			req.ModRev = lastMod[op.Client][req.Key]
		}
		before := state
		var resp Response
		switch req.Kind {
		case Get:
			resp = Response{Rev: state.Rev, KV: state.Keys[req.Key]}
		case Range:
			resp = Response{Rev: state.Rev, All: state.Keys}
		case Put:
			resp = Response{KV: state.Keys[req.Key]}
			if o.LoseKey == req.Key && !lost && s.at >= loseFrom && !op.Resp.Unknown {
				// Acknowledged at the next revision, never applied.
				lost = true
				resp.Rev = state.Rev + 1
				break
			}
			if s.applied {
				state = state.put(req.Key, req.Value)
				emit(req.Key, EventPut, state.Keys[req.Key], s.at)
			}
			resp.Rev = state.Rev
		case Delete:
			resp = Response{KV: state.Keys[req.Key]}
			if resp.KV.Exists() && s.applied {
				state = state.del(req.Key)
				resp.Deleted = 1
				emit(req.Key, EventDelete, KeyValue{Mod: state.Rev}, s.at)
			}
			resp.Rev = state.Rev
		case CAS:
			if state.Keys[req.Key].Mod == req.ModRev {
				if s.applied {
					state = state.put(req.Key, req.Value)
					emit(req.Key, EventPut, state.Keys[req.Key], s.at)
				}
				resp = Response{Rev: state.Rev, Succeeded: true}
			} else {
				resp = Response{Rev: state.Rev, KV: state.Keys[req.Key]}
			}
		}
		if !op.Resp.Unknown {
			op.Resp = resp
			lastMod[op.Client][req.Key] = state.Keys[req.Key].Mod
			if req.Kind == Range {
				lastMod[op.Client] = [NumKeys]int64{}
				for k, kv := range state.Keys {
					lastMod[op.Client][k] = kv.Mod
				}
			}
		}
		out.Ops = append(out.Ops, *op)
		out.Before = append(out.Before, before)
	}
	out.FinalRev = state.Rev
	out.WatchComplete = true
	return out
}
