package etcddiff

import (
	"bytes"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// A write is followed by a read of the watch streams only when it may
// concern one of their watchers; the spans below err on the side of
// "may": a stream read for nothing costs a round trip, a stream not read
// keeps its events for the next read, where they are compared all the
// same.

// span is the keys [from, to); a nil to is every key from from on.
type span struct{ from, to []byte }

// everything is every key, for writes whose keys the generator does not
// know (a lease revocation deletes the lease's keys).
var everything = span{from: []byte{}}

// keySpan is the keys a request's key and range end name, as etcd reads
// them: no end is the key alone, "\x00" every key from it on.
func keySpan(key, end []byte) span {
	switch {
	case len(end) == 0:
		return span{key, append(append([]byte(nil), key...), 0)}
	case len(end) == 1 && end[0] == 0:
		return span{key, nil}
	}
	return span{key, end}
}

func (a span) overlaps(b span) bool {
	before := func(k, to []byte) bool { return to == nil || bytes.Compare(k, to) < 0 }
	return before(a.from, b.to) && before(b.from, a.to)
}

// writes returns the spans a write request may change; nil for requests
// that change no key.
func writes(req any) []span {
	switch r := req.(type) {
	case *pb.PutRequest:
		return []span{keySpan(r.Key, nil)}
	case *pb.DeleteRangeRequest:
		return []span{keySpan(r.Key, r.RangeEnd)}
	case *pb.LeaseRevokeRequest:
		return []span{everything}
	case *pb.TxnRequest:
		var out []span
		walkTxn(r, func(op *pb.RequestOp) bool {
			switch {
			case op.GetRequestPut() != nil:
				out = append(out, writes(op.GetRequestPut())...)
			case op.GetRequestDeleteRange() != nil:
				out = append(out, writes(op.GetRequestDeleteRange())...)
			}
			return false
		})
		return out
	}
	return nil
}
