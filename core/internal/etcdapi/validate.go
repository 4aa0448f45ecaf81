package etcdapi

import (
	"bytes"
	"sort"

	"github.com/engramkv/engram/core/internal/coder"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// sizer is implemented by etcd's gogo-generated messages.
type sizer interface{ Size() int }

func (l Limits) checkSize(m sizer) error {
	if m.Size() > l.MaxRequestBytes {
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

func (l Limits) checkTxn(r *pb.TxnRequest) error {
	if len(r.Compare) > l.MaxTxnOps || len(r.Success) > l.MaxTxnOps || len(r.Failure) > l.MaxTxnOps {
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
			if err := l.checkOp(op); err != nil {
				return err
			}
		}
	}
	if _, _, err := checkIntervals(r.Success); err != nil {
		return err
	}
	if _, _, err := checkIntervals(r.Failure); err != nil {
		return err
	}
	return nil
}

func (l Limits) checkOp(op *pb.RequestOp) error {
	switch r := op.Request.(type) {
	case *pb.RequestOp_RequestRange:
		return l.checkRange(r.RequestRange)
	case *pb.RequestOp_RequestPut:
		return l.checkPut(r.RequestPut)
	case *pb.RequestOp_RequestDeleteRange:
		return l.checkDelete(r.RequestDeleteRange)
	case *pb.RequestOp_RequestTxn:
		return l.checkTxn(r.RequestTxn)
	case nil:
		// etcd's answer to an empty op, odd as its message is.
		return rpctypes.ErrGRPCKeyNotFound
	default:
		return status.Errorf(codes.InvalidArgument, "engram: unknown request op %T", op.Request)
	}
}

type interval struct{ key, end []byte }

func (iv interval) contains(k []byte) bool { return coder.InRange(k, iv.key, iv.end) }

// checkIntervals enforces etcd's rule that one branch of a transaction (with
// its nested transactions) never writes a key twice: no key is put twice and
// no put falls inside a deleted range.
func checkIntervals(ops []*pb.RequestOp) ([]interval, map[string]struct{}, error) {
	var dels []interval
	puts := map[string]struct{}{}
	addPut := func(k string) error {
		if _, dup := puts[k]; dup {
			return rpctypes.ErrGRPCDuplicateKey
		}
		puts[k] = struct{}{}
		return nil
	}
	for _, op := range ops {
		switch r := op.Request.(type) {
		case *pb.RequestOp_RequestPut:
			if err := addPut(string(r.RequestPut.Key)); err != nil {
				return nil, nil, err
			}
		case *pb.RequestOp_RequestDeleteRange:
			dels = append(dels, interval{r.RequestDeleteRange.Key, r.RequestDeleteRange.RangeEnd})
		case *pb.RequestOp_RequestTxn:
			sd, sp, err := checkIntervals(r.RequestTxn.Success)
			if err != nil {
				return nil, nil, err
			}
			fd, fp, err := checkIntervals(r.RequestTxn.Failure)
			if err != nil {
				return nil, nil, err
			}
			// Only one nested branch runs, so the two may overlap each
			// other, but neither may overlap this level.
			both := map[string]struct{}{}
			for k := range sp {
				both[k] = struct{}{}
			}
			for k := range fp {
				both[k] = struct{}{}
			}
			keys := make([]string, 0, len(both))
			for k := range both {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				if err := addPut(k); err != nil {
					return nil, nil, err
				}
			}
			dels = append(dels, sd...)
			dels = append(dels, fd...)
		}
	}
	for k := range puts {
		for _, d := range dels {
			if d.contains([]byte(k)) {
				return nil, nil, rpctypes.ErrGRPCDuplicateKey
			}
		}
	}
	return dels, puts, nil
}
