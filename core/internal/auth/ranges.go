package auth

import (
	"bytes"
	"slices"
)

// interval is [begin, end); a nil end is past every key.
type interval struct{ begin, end []byte }

type userPerms struct{ read, write []interval }

// cmpEnd orders ends with nil (infinity) last.
func cmpEnd(a, b []byte) int {
	switch {
	case a == nil && b == nil:
		return 0
	case a == nil:
		return 1
	case b == nil:
		return -1
	}
	return bytes.Compare(a, b)
}

// merge sorts the intervals and joins overlapping or touching ones, so a
// request spanning two adjacent grants is allowed, as etcd's interval tree
// union allows it.
func merge(ivs []interval) []interval {
	if len(ivs) == 0 {
		return nil
	}
	slices.SortFunc(ivs, func(a, b interval) int { return bytes.Compare(a.begin, b.begin) })
	out := []interval{ivs[0]}
	for _, iv := range ivs[1:] {
		last := &out[len(out)-1]
		if last.end == nil || bytes.Compare(iv.begin, last.end) <= 0 {
			if cmpEnd(iv.end, last.end) > 0 {
				last.end = iv.end
			}
			continue
		}
		out = append(out, iv)
	}
	return out
}

// covers reports whether the merged set holds key (end empty) or the whole
// of [key, end) ("\x00": every key from key on).
func covers(ivs []interval, key, end []byte) bool {
	if len(end) == 0 {
		for _, iv := range ivs {
			if bytes.Compare(iv.begin, key) <= 0 && (iv.end == nil || bytes.Compare(key, iv.end) < 0) {
				return true
			}
		}
		return false
	}
	if isOpenEnded(end) {
		end = nil
	}
	for _, iv := range ivs {
		if bytes.Compare(iv.begin, key) <= 0 && cmpEnd(end, iv.end) <= 0 {
			return true
		}
	}
	return false
}
