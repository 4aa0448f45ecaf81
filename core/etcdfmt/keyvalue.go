package etcdfmt

import (
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/encoding/protowire"
)

// KeyValue is one version of one key as etcd's key bucket stores it: the
// fields of mvccpb.KeyValue, plus any fields this version of the format
// does not know, kept so a row read from an etcd file is written back
// unchanged.
//
// It is a plain struct rather than mvccpb.KeyValue itself because etcd's
// API types are protobuf-go messages since v3.7: those must not be copied
// by value, and an Entry is a value that export, sort and snapshot code
// copies freely.
type KeyValue struct {
	Key            []byte
	CreateRevision int64
	ModRevision    int64
	Version        int64
	Value          []byte
	Lease          int64
	// Unknown holds fields other than 1-6, as read, in their wire form.
	Unknown []byte
}

// KeyValueOf copies the fields of an API KeyValue.
func KeyValueOf(kv *mvccpb.KeyValue) KeyValue {
	return KeyValue{
		Key: kv.GetKey(), CreateRevision: kv.GetCreateRevision(), ModRevision: kv.GetModRevision(),
		Version: kv.GetVersion(), Value: kv.GetValue(), Lease: kv.GetLease(),
	}
}

// Proto returns kv as an API KeyValue (unknown fields are dropped: the API
// never carries them).
func (kv *KeyValue) Proto() *mvccpb.KeyValue {
	return &mvccpb.KeyValue{
		Key: kv.Key, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision,
		Version: kv.Version, Value: kv.Value, Lease: kv.Lease,
	}
}

// Marshal writes kv as etcd writes an mvccpb.KeyValue: fields in number
// order, zero values omitted, unknown fields last.
func (kv *KeyValue) Marshal() []byte {
	return kv.AppendMarshal(make([]byte, 0, kv.MarshalBound()))
}

// MarshalBound bounds the length of kv's marshalled form.
func (kv *KeyValue) MarshalBound() int {
	return len(kv.Key) + len(kv.Value) + len(kv.Unknown) + 48
}

// AppendMarshal appends kv's marshalled form to b.
func (kv *KeyValue) AppendMarshal(b []byte) []byte {
	if len(kv.Key) > 0 {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, kv.Key)
	}
	for i, v := range [...]int64{kv.CreateRevision, kv.ModRevision, kv.Version} {
		if v != 0 {
			b = protowire.AppendTag(b, protowire.Number(i+2), protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(v))
		}
	}
	if len(kv.Value) > 0 {
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		b = protowire.AppendBytes(b, kv.Value)
	}
	if kv.Lease != 0 {
		b = protowire.AppendTag(b, 6, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(kv.Lease))
	}
	return append(b, kv.Unknown...)
}

// Unmarshal reads a marshalled mvccpb.KeyValue into kv, copying every byte
// slice out of b (a bbolt value is only valid inside its transaction). A
// known field with the wrong wire type is malformed, as etcd's own
// (gogo-generated) decoder says.
func (kv *KeyValue) Unmarshal(b []byte) error { return kv.unmarshal(b, false) }

// UnmarshalView is Unmarshal without the copies: kv's byte slices alias b.
// A reader that copies each row somewhere else at once (the restore's
// sort) saves an allocation of the row's size.
func (kv *KeyValue) UnmarshalView(b []byte) error { return kv.unmarshal(b, true) }

func (kv *KeyValue) unmarshal(b []byte, view bool) error {
	*kv = KeyValue{}
	own := func(v []byte) []byte {
		if view {
			return v[:len(v):len(v)]
		}
		return append([]byte{}, v...)
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		field := b
		b = b[n:]
		switch {
		case (num == 1 || num == 5) && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			if num == 1 {
				kv.Key = own(v)
			} else {
				kv.Value = own(v)
			}
			b = b[m:]
		case num >= 2 && num <= 6 && num != 5 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			setVarintField([]*int64{2: &kv.CreateRevision, 3: &kv.ModRevision, 4: &kv.Version, 6: &kv.Lease}, num, v)
			b = b[m:]
		case num >= 1 && num <= 6:
			return fmt.Errorf("field %d has wire type %d", num, typ)
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			if view && kv.Unknown == nil {
				// Copied after all: several unknown fields are
				// joined, and they are rare.
				kv.Unknown = []byte{}
			}
			kv.Unknown = append(kv.Unknown, field[:n+m]...)
			b = b[m:]
		}
	}
	return nil
}
