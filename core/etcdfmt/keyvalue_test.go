package etcdfmt

import (
	"bytes"
	"reflect"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// TestKeyValueWireForm checks KeyValue's hand-written encoding against the
// protobuf library's for etcd's own message, and that a field this format
// does not know survives a decode and encode.
func TestKeyValueWireForm(t *testing.T) {
	for _, kv := range []KeyValue{
		{},
		{Key: []byte("a")},
		{Key: []byte("k"), CreateRevision: 2, ModRevision: 9, Version: 3, Value: []byte("v"), Lease: 0x7fff},
		{Key: []byte("neg"), CreateRevision: -1, Lease: -42},
	} {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(kv.Proto())
		if err != nil {
			t.Fatal(err)
		}
		if got := kv.Marshal(); !bytes.Equal(got, want) {
			t.Errorf("%+v: Marshal %x, protobuf %x", kv, got, want)
		}
		var back KeyValue
		if err := back.Unmarshal(want); err != nil || !proto.Equal(back.Proto(), kv.Proto()) {
			t.Errorf("%+v: Unmarshal gave %+v, %v", kv, back, err)
		}
	}
	unknown := protowire.AppendTag(nil, 9, protowire.BytesType)
	unknown = protowire.AppendBytes(unknown, []byte("later"))
	in := append((&KeyValue{Key: []byte("k"), ModRevision: 2}).Marshal(), unknown...)
	var kv KeyValue
	if err := kv.Unmarshal(in); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(kv.Unknown, unknown) || !bytes.Equal(kv.Marshal(), in) {
		t.Errorf("unknown field: kept %x, re-encoded %x, want %x", kv.Unknown, kv.Marshal(), in)
	}
	bad := protowire.AppendTag(nil, 2, protowire.BytesType)
	bad = protowire.AppendBytes(bad, []byte("x"))
	if err := kv.Unmarshal(bad); err == nil {
		t.Error("create_revision as bytes decoded without error")
	}
	var m mvccpb.KeyValue
	if err := proto.Unmarshal(in, &m); err != nil || string(m.Key) != "k" {
		t.Errorf("protobuf cannot read KeyValue.Marshal's output: %v", err)
	}
}

// TestUnmarshalView: the view decodes what Unmarshal decodes, aliasing the
// input instead of copying it.
func TestUnmarshalView(t *testing.T) {
	in := KeyValue{Key: []byte("k"), CreateRevision: 2, ModRevision: 3, Version: 2, Value: []byte("value"), Lease: 7,
		Unknown: protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 1)}
	raw := in.Marshal()
	var copied, view KeyValue
	if err := copied.Unmarshal(raw); err != nil {
		t.Fatal(err)
	}
	if err := view.UnmarshalView(raw); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(copied, view) || !reflect.DeepEqual(copied, in) {
		t.Fatalf("Unmarshal %+v, UnmarshalView %+v, marshalled %+v", copied, view, in)
	}
	raw[bytes.Index(raw, []byte("value"))] = 'V'
	if string(view.Value) != "Value" || string(copied.Value) != "value" {
		t.Fatalf("after changing the input: view %q (want it to follow), copy %q (want it not to)", view.Value, copied.Value)
	}
}
