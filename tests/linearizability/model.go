package linearizability

import (
	"fmt"
	"strings"

	"github.com/anishathalye/porcupine"
)

// NumKeys is the size of the key set every run works on. Few keys make
// operations collide often (compare-and-swap races, reads of keys being
// written), which is where linearizability bugs show.
const NumKeys = 8

// KeyPrefix is the prefix of the keys a run writes: KeyPrefix + "k0" ...
// The watcher watches the prefix; nothing else writes under it.
const KeyPrefix = "/lin/"

// KeyName is the etcd key of key index i.
func KeyName(i int) string { return fmt.Sprintf("%sk%d", KeyPrefix, i) }

// KeyIndex is the index of an etcd key of the run's key set, or -1.
func KeyIndex(key string) int {
	var i int
	if _, err := fmt.Sscanf(key, KeyPrefix+"k%d", &i); err != nil || i < 0 || i >= NumKeys || KeyName(i) != key {
		return -1
	}
	return i
}

// Kind is an operation's type.
type Kind uint8

const (
	// Get reads one key.
	Get Kind = iota + 1
	// Put writes one key (with the previous value returned, WithPrevKV).
	Put
	// Delete deletes one key (with the previous value returned).
	Delete
	// CAS is a transaction: If mod_revision(key) == ModRev Then Put(key,
	// Value) Else Get(key).
	CAS
	// Range reads every key of the set in one request (a prefix range);
	// the read-backs after restarts are ranges.
	Range
)

func (k Kind) String() string {
	switch k {
	case Get:
		return "get"
	case Put:
		return "put"
	case Delete:
		return "delete"
	case CAS:
		return "cas"
	case Range:
		return "range"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// IsWrite reports whether operations of kind k may change the store.
func (k Kind) IsWrite() bool { return k == Put || k == Delete || k == CAS }

// KeyValue is one key as etcd reports it. The zero value is an absent key
// (etcd reports no key-value, and revision 0 in comparisons).
type KeyValue struct {
	Value   string
	Create  int64
	Mod     int64
	Version int64
}

// Exists reports whether the key is present.
func (kv KeyValue) Exists() bool { return kv.Version > 0 }

func (kv KeyValue) String() string {
	if !kv.Exists() {
		return "<absent>"
	}
	return fmt.Sprintf("%q@c%d/m%d/v%d", kv.Value, kv.Create, kv.Mod, kv.Version)
}

// Request is an operation's input.
type Request struct {
	Kind Kind
	// Key is the key index (unused by Range).
	Key int
	// Value is the value a Put or CAS writes; unique in a history, so a
	// watch event names the write it comes from.
	Value string
	// ModRev is a CAS's expected mod revision (0: the key is absent).
	ModRev int64
}

func (r Request) String() string {
	switch r.Kind {
	case Get, Delete:
		return fmt.Sprintf("%s(k%d)", r.Kind, r.Key)
	case Put:
		return fmt.Sprintf("put(k%d, %q)", r.Key, r.Value)
	case CAS:
		return fmt.Sprintf("cas(k%d mod==%d ? put %q : get)", r.Key, r.ModRev, r.Value)
	case Range:
		return "range(all)"
	}
	return r.Kind.String()
}

// Response is an operation's output. Rev is the response header's
// revision: for a write that changed the store, the write's revision; for
// anything else, the store's revision the answer was taken at.
type Response struct {
	// Unknown: the client got an error or a timeout, so whether a write
	// took effect is unknown. Only writes are recorded unknown (a failed
	// read is dropped). When the watch resolved the outcome, Rev holds the
	// revision the write was applied at (and for CAS, Succeeded is set).
	Unknown bool
	Rev     int64
	// KV: Get's key, Put's and Delete's previous key, CAS's key when the
	// comparison failed (the Else branch's Get).
	KV KeyValue
	// Succeeded: CAS took the Then branch.
	Succeeded bool
	// Deleted: how many keys a Delete removed (0 or 1).
	Deleted int64
	// All: Range's answer, by key index.
	All [NumKeys]KeyValue
}

func (r Response) String() string { return r.Format(0) }

// Format renders the response of an operation of kind k (0: every field).
func (r Response) Format(k Kind) string {
	if r.Unknown {
		if r.Rev != 0 {
			return fmt.Sprintf("unknown, the watch shows it applied at rev %d", r.Rev)
		}
		return "unknown (error or timeout)"
	}
	switch k {
	case Get:
		return fmt.Sprintf("rev %d %s", r.Rev, r.KV)
	case Put:
		return fmt.Sprintf("rev %d prev %s", r.Rev, r.KV)
	case Delete:
		return fmt.Sprintf("rev %d deleted %d prev %s", r.Rev, r.Deleted, r.KV)
	case CAS:
		if r.Succeeded {
			return fmt.Sprintf("rev %d succeeded", r.Rev)
		}
		return fmt.Sprintf("rev %d failed, key %s", r.Rev, r.KV)
	}
	var parts []string
	for i, kv := range r.All {
		if kv.Exists() {
			parts = append(parts, fmt.Sprintf("k%d=%s", i, kv))
		}
	}
	if k == Range {
		return fmt.Sprintf("rev %d {%s}", r.Rev, strings.Join(parts, " "))
	}
	return fmt.Sprintf("rev %d kv=%s succeeded=%v deleted=%d all={%s}", r.Rev, r.KV, r.Succeeded, r.Deleted, strings.Join(parts, " "))
}

// State is the model's state: etcd's revision and every key. It is a
// comparable value, so porcupine's default equality and cheap copies work.
type State struct {
	Rev  int64
	Keys [NumKeys]KeyValue
}

// InitialState is an empty etcd store: revision 1, no keys.
func InitialState() State { return State{Rev: 1} }

func (s State) String() string {
	var parts []string
	for i, kv := range s.Keys {
		if kv.Exists() {
			parts = append(parts, fmt.Sprintf("k%d=%s", i, kv))
		}
	}
	return fmt.Sprintf("rev %d {%s}", s.Rev, strings.Join(parts, " "))
}

// put is the state after writing value to key k at the next revision.
func (s State) put(k int, value string) State {
	s.Rev++
	old := s.Keys[k]
	nkv := KeyValue{Value: value, Create: s.Rev, Mod: s.Rev, Version: 1}
	if old.Exists() {
		nkv.Create, nkv.Version = old.Create, old.Version+1
	}
	s.Keys[k] = nkv
	return s
}

// del is the state after deleting key k; deleting an absent key changes
// nothing, not even the revision.
func (s State) del(k int) State {
	if !s.Keys[k].Exists() {
		return s
	}
	s.Rev++
	s.Keys[k] = KeyValue{}
	return s
}

// Step is etcd's KV semantics for one operation: whether the response is
// possible in state s, and the state after it.
func Step(s State, req Request, resp Response) (bool, State) {
	if resp.Unknown {
		return stepUnknown(s, req, resp)
	}
	switch req.Kind {
	case Get:
		return resp.Rev == s.Rev && resp.KV == s.Keys[req.Key], s
	case Range:
		return resp.Rev == s.Rev && resp.All == s.Keys, s
	case Put:
		next := s.put(req.Key, req.Value)
		return resp.Rev == next.Rev && resp.KV == s.Keys[req.Key], next
	case Delete:
		if !s.Keys[req.Key].Exists() {
			return resp.Rev == s.Rev && resp.Deleted == 0 && !resp.KV.Exists(), s
		}
		next := s.del(req.Key)
		return resp.Rev == next.Rev && resp.Deleted == 1 && resp.KV == s.Keys[req.Key], next
	case CAS:
		if s.Keys[req.Key].Mod == req.ModRev {
			next := s.put(req.Key, req.Value)
			return resp.Succeeded && resp.Rev == next.Rev, next
		}
		return !resp.Succeeded && resp.Rev == s.Rev && resp.KV == s.Keys[req.Key], s
	}
	return false, s
}

// stepUnknown applies a write whose outcome the client never learned. Such
// an operation has no return time (porcupine linearizes it anywhere after
// its call, or after everything, which is the same as never), so applying
// it is the only choice the model needs. When the watch resolved it, the
// write must land exactly at the revision the watch reported.
func stepUnknown(s State, req Request, resp Response) (bool, State) {
	var next State
	switch req.Kind {
	case Put:
		next = s.put(req.Key, req.Value)
	case Delete:
		next = s.del(req.Key)
	case CAS:
		if s.Keys[req.Key].Mod != req.ModRev {
			// The comparison fails here: nothing changes. A CAS the
			// watch showed applied cannot fail.
			return resp.Rev == 0, s
		}
		next = s.put(req.Key, req.Value)
	default:
		return false, s
	}
	if resp.Rev != 0 && resp.Rev != next.Rev {
		return false, s
	}
	return true, next
}

// Model is the porcupine model of etcd's KV over the key set. There is one
// partition: the revision is global, so keys cannot be checked apart.
func Model() porcupine.Model {
	return porcupine.Model{
		Init: func() any { return InitialState() },
		Step: func(state, input, output any) (bool, any) {
			return Step(state.(State), input.(Request), output.(Response))
		},
		Hash: func(state any) uint64 {
			s := state.(State)
			h := uint64(s.Rev)
			for _, kv := range s.Keys {
				h = h*1099511628211 ^ uint64(kv.Mod)
			}
			return h
		},
		DescribeOperation: func(input, output any) string {
			req := input.(Request)
			return fmt.Sprintf("%s -> %s", req, output.(Response).Format(req.Kind))
		},
		DescribeState: func(state any) string { return state.(State).String() },
	}
}
