package etcdapi

import (
	"bytes"
	"slices"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Limits bound what a request may carry.
type Limits struct {
	// MaxRequestBytes bounds the encoded request (etcd default 1.5 MiB).
	MaxRequestBytes int
	// MaxTxnOps bounds compares and ops per branch (etcd default 128).
	MaxTxnOps int
	// MaxKeyBytes bounds one key.
	MaxKeyBytes int
}

// Defaults as etcd's.
const (
	DefaultMaxRequestBytes = 1536 * 1024
	DefaultMaxTxnOps       = 128
	// DefaultMaxKeyBytes keeps internal keys well inside every engine's
	// limit (badger: 65000 bytes). etcd has no separate key limit, but no
	// Kubernetes key comes close.
	DefaultMaxKeyBytes = 32 * 1024
)

func (l Limits) withDefaults() Limits {
	if l.MaxRequestBytes <= 0 {
		l.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if l.MaxTxnOps <= 0 {
		l.MaxTxnOps = DefaultMaxTxnOps
	}
	if l.MaxKeyBytes <= 0 {
		l.MaxKeyBytes = DefaultMaxKeyBytes
	}
	return l
}

func (l Limits) checkSize(m proto.Message) error {
	if proto.Size(m) > l.MaxRequestBytes {
		return rpctypes.ErrGRPCRequestTooLarge
	}
	return nil
}

func (l Limits) checkKey(key []byte) error {
	if len(key) == 0 {
		return rpctypes.ErrGRPCEmptyKey
	}
	// The internal key escapes every 0x00 byte, so the limit applies to the
	// escaped length: a key of zero bytes counts double.
	if n := len(key) + bytes.Count(key, []byte{0}); n > l.MaxKeyBytes {
		return status.Errorf(codes.InvalidArgument, "engram: key of %d bytes (%d with 0x00 bytes counted twice) exceeds the limit of %d bytes", len(key), n, l.MaxKeyBytes)
	}
	return nil
}

func (l Limits) checkRange(r *pb.RangeRequest) error {
	if err := l.checkKey(r.Key); err != nil {
		return err
	}
	if _, ok := pb.RangeRequest_SortOrder_name[int32(r.SortOrder)]; !ok {
		return rpctypes.ErrGRPCInvalidSortOption
	}
	if _, ok := pb.RangeRequest_SortTarget_name[int32(r.SortTarget)]; !ok {
		return rpctypes.ErrGRPCInvalidSortOption
	}
	return nil
}

func (l Limits) checkPut(r *pb.PutRequest) error {
	if err := l.checkKey(r.Key); err != nil {
		return err
	}
	if r.IgnoreValue && len(r.Value) != 0 {
		return rpctypes.ErrGRPCValueProvided
	}
	if r.IgnoreLease && r.Lease != 0 {
		return rpctypes.ErrGRPCLeaseProvided
	}
	return nil
}

func (l Limits) checkDelete(r *pb.DeleteRangeRequest) error {
	return l.checkKey(r.Key)
}

// checkTxn validates a transaction as etcd's gRPC layer does, in its
// order: the shape of every request first, then the duplicate-key rule of
// each top-level branch.
func (l Limits) checkTxn(r *pb.TxnRequest) error {
	if err := l.checkTxnOps(r, l.MaxTxnOps); err != nil {
		return err
	}
	if err := checkBranch(r.Success); err != nil {
		return err
	}
	return checkBranch(r.Failure)
}

// smallBranch is the most ops checkBranch compares pairwise; Kubernetes'
// transactions have one or two.
const smallBranch = 16

// checkBranch applies checkIntervals' rule to a top-level branch. A small
// branch without nested transactions, every one Kubernetes sends, is
// checked without building checkIntervals' sets (they were most of what
// validating a create or update allocated): the rule then is only that no
// put repeats an earlier put's key or falls in a delete's interval.
func checkBranch(ops []*pb.RequestOp) error {
	if len(ops) > smallBranch || slices.ContainsFunc(ops, func(op *pb.RequestOp) bool { return op.GetRequestTxn() != nil }) {
		_, _, err := checkIntervals(ops)
		return err
	}
	for i, op := range ops {
		p := op.GetRequestPut()
		if p == nil {
			continue
		}
		for _, other := range ops {
			if d := other.GetRequestDeleteRange(); d != nil && (interval{d.Key, d.RangeEnd}).covers(p.Key) {
				return rpctypes.ErrGRPCDuplicateKey
			}
		}
		for _, prev := range ops[:i] {
			if q := prev.GetRequestPut(); q != nil && bytes.Equal(q.Key, p.Key) {
				return rpctypes.ErrGRPCDuplicateKey
			}
		}
	}
	return nil
}

// checkTxnOps bounds the widest of r's compares and branches by budget; a
// nested transaction gets what r's widest list left of it, so nesting
// cannot multiply the limit (etcd's rule: a Range beside a nested
// Txn of 128 Ranges is too many).
func (l Limits) checkTxnOps(r *pb.TxnRequest, budget int) error {
	width := max(len(r.Compare), len(r.Success), len(r.Failure))
	if width > budget {
		return rpctypes.ErrGRPCTooManyOps
	}
	for _, c := range r.Compare {
		if err := l.checkKey(c.Key); err != nil {
			return err
		}
		// An unknown target or result is not refused: etcd evaluates it
		// (mvcc's compareHeader follows its rule), and clients that send
		// one get etcd's answer.
	}
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			if err := l.checkOp(op, budget-width); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l Limits) checkOp(op *pb.RequestOp, budget int) error {
	switch r := op.Request.(type) {
	case *pb.RequestOp_RequestRange:
		return l.checkRange(r.RequestRange)
	case *pb.RequestOp_RequestPut:
		return l.checkPut(r.RequestPut)
	case *pb.RequestOp_RequestDeleteRange:
		return l.checkDelete(r.RequestDeleteRange)
	case *pb.RequestOp_RequestTxn:
		return l.checkTxnOps(r.RequestTxn, budget)
	case nil:
		// etcd's answer to an empty op, odd as its message is.
		return rpctypes.ErrGRPCKeyNotFound
	default:
		return status.Errorf(codes.InvalidArgument, "engram: unknown request op %T", op.Request)
	}
}

// interval is a deleted range as etcd's duplicate-key rule reads it: the
// range end is taken literally, so "\x00" (which executes as "to the end
// of the keyspace") covers nothing, and an end at or below the key covers
// nothing either. No end means the key alone.
type interval struct{ key, end []byte }

func (iv interval) covers(k []byte) bool {
	if len(iv.end) == 0 {
		return bytes.Equal(k, iv.key)
	}
	return bytes.Compare(iv.key, k) <= 0 && bytes.Compare(k, iv.end) < 0
}

func coveredBy(dels []interval, k string) bool {
	for _, d := range dels {
		if d.covers([]byte(k)) {
			return true
		}
	}
	return false
}

// checkIntervals applies etcd's rule against writing a key twice in one
// branch, returning the branch's puts and deletes for the level above. Its
// quirks are etcd's and clients see them, so they are kept: a nested
// transaction's puts are checked against this level's deletes and those of
// the nested transactions before it, but not those after it; the then and
// else branches of one nested transaction may put the same key; and a
// delete's range end is literal (see interval).
func checkIntervals(ops []*pb.RequestOp) (map[string]struct{}, []interval, error) {
	var dels []interval
	for _, op := range ops {
		if d := op.GetRequestDeleteRange(); d != nil {
			dels = append(dels, interval{d.Key, d.RangeEnd})
		}
	}
	puts := map[string]struct{}{}
	for _, op := range ops {
		nt := op.GetRequestTxn()
		if nt == nil {
			continue
		}
		thenPuts, thenDels, err := checkIntervals(nt.Success)
		if err != nil {
			return nil, nil, err
		}
		elsePuts, elseDels, err := checkIntervals(nt.Failure)
		if err != nil {
			return nil, nil, err
		}
		for k := range thenPuts {
			if _, dup := puts[k]; dup || coveredBy(dels, k) {
				return nil, nil, rpctypes.ErrGRPCDuplicateKey
			}
			puts[k] = struct{}{}
		}
		for k := range elsePuts {
			_, dup := puts[k]
			_, inThen := thenPuts[k]
			if dup && !inThen || coveredBy(dels, k) {
				return nil, nil, rpctypes.ErrGRPCDuplicateKey
			}
			puts[k] = struct{}{}
		}
		dels = append(dels, thenDels...)
		dels = append(dels, elseDels...)
	}
	for _, op := range ops {
		p := op.GetRequestPut()
		if p == nil {
			continue
		}
		k := string(p.Key)
		if _, dup := puts[k]; dup || coveredBy(dels, k) {
			return nil, nil, rpctypes.ErrGRPCDuplicateKey
		}
		puts[k] = struct{}{}
	}
	return puts, dels, nil
}
