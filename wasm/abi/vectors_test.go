package abi

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"reflect"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/vectors.json from the cases in vectors_test.go")

// message is a request type of the codec.
type message interface {
	Append([]byte) []byte
	Decode([]byte) error
}

// goldenCase is a vector together with the Go value it encodes and a
// decoder that turns bytes back into a comparable value.
type goldenCase struct {
	Vector
	encode func() []byte
	decode func(b []byte) (any, error)
	value  any
}

func golden() []goldenCase {
	req := func(name string, op Op, note string, m message, fresh func() message) goldenCase {
		return goldenCase{
			Vector: Vector{Name: name, Op: op.String(), Direction: "request", Note: note},
			encode: func() []byte { return m.Append(nil) },
			decode: func(b []byte) (any, error) {
				v := fresh()
				err := v.Decode(b)
				return v, err
			},
			value: m,
		}
	}
	resp := func(name string, op Op, note string, b []byte, decode func([]byte) (any, error), value any) goldenCase {
		return goldenCase{
			Vector: Vector{Name: name, Op: op.String(), Direction: "response", Note: note},
			encode: func() []byte { return b },
			decode: decode,
			value:  value,
		}
	}
	type conflict struct {
		Index   uint32
		Exists  bool
		Current []byte
	}
	type opened struct {
		ID    uint64
		Pairs []Pair
		More  bool
	}
	split := func(want Status) func([]byte) ([]byte, error) {
		return func(b []byte) ([]byte, error) {
			st, body, err := SplitResponse(b)
			if err != nil {
				return nil, err
			}
			if st != want {
				return nil, ErrBadValue
			}
			return body, nil
		}
	}
	decodeManifest := func(b []byte) (any, error) {
		body, err := split(StatusOK)(b)
		if err != nil {
			return nil, err
		}
		var m Manifest
		err = m.Decode(body)
		return &m, err
	}
	return []goldenCase{
		req("init-request", OpInit,
			"deadline 1700000000000000000 (2023-11-14T22:13:20Z), config \"dsn=x\", host_flags 1 (net), instance 2, max_response 67108864",
			&InitRequest{Header: Header{Deadline: 1700000000000000000}, Config: []byte("dsn=x"), HostFlags: HostFlagNet, Instance: 2, MaxResponse: 64 << 20},
			func() message {
				return &InitRequest{}
			}),
		req("get-request", OpGet, "no deadline, key \"a\\x00\\xff\"",
			&GetRequest{Key: []byte("a\x00\xff")},
			func() message {
				return &GetRequest{}
			}),
		req("scan-open-request", OpScanOpen, "deadline 1, start \"a\", end \"b\", reverse, limit 300, batch_size 128",
			&ScanOpenRequest{Header: Header{Deadline: 1}, Start: []byte("a"), End: []byte("b"), Reverse: true, Limit: 300, BatchSize: 128},
			func() message {
				return &ScanOpenRequest{}
			}),
		req("scan-next-request", OpScanNext, "no deadline, scan_id 7, batch_size 0",
			&ScanNextRequest{ID: 7},
			func() message {
				return &ScanNextRequest{}
			}),
		req("scan-close-request", OpScanClose, "no deadline, scan_id 200",
			&ScanCloseRequest{ID: 200},
			func() message {
				return &ScanCloseRequest{}
			}),
		req("commit-request", OpCommit,
			"no deadline, 5 ops: PUT k1=v1; DELETE k2; PUT_IF_ABSENT k3=\"\"; COMPARE_AND_SWAP k4 expected o new n; COMPARE_AND_DELETE k5 expected o",
			&CommitRequest{Ops: []CommitOp{
				{Kind: KindPut, Key: []byte("k1"), Value: []byte("v1")},
				{Kind: KindDelete, Key: []byte("k2")},
				{Kind: KindPutIfAbsent, Key: []byte("k3"), Value: []byte{}},
				{Kind: KindCompareAndSwap, Key: []byte("k4"), Expected: []byte("o"), Value: []byte("n")},
				{Kind: KindCompareAndDelete, Key: []byte("k5"), Expected: []byte("o")},
			}},
			func() message {
				return &CommitRequest{}
			}),
		req("partitions-request", OpPartitions, "no deadline, start \"\", end \"z\", max_parts 4",
			&PartitionsRequest{End: []byte("z"), MaxParts: 4},
			func() message {
				return &PartitionsRequest{}
			}),
		req("close-request", OpClose, "no deadline",
			&EmptyRequest{},
			func() message {
				return &EmptyRequest{}
			}),
		req("size-request", OpSize, "deadline 1700000000000000000 (2023-11-14T22:13:20Z); the header alone",
			&EmptyRequest{Header: Header{Deadline: 1700000000000000000}},
			func() message {
				return &EmptyRequest{}
			}),
		req("reclaim-request", OpReclaim, "deadline 1700000000000000000 (2023-11-14T22:13:20Z); the header alone",
			&EmptyRequest{Header: Header{Deadline: 1700000000000000000}},
			func() message {
				return &EmptyRequest{}
			}),
		resp("init-response", OpInit,
			"OK, manifest: name \"memkv\", version \"1.0\", abi_minor 0, model single, max_instances 1, ops 0x3fe (INIT..IDLE), features 1 (partitions), max_commit_ops 0, max_commit_bytes 0, max_scan_batch 1000",
			AppendManifest(nil, &Manifest{Name: "memkv", Version: "1.0", Model: ModelSingle, MaxInstances: 1, Ops: 0x3fe, Features: FeaturePartitions, MaxScanBatch: 1000}),
			decodeManifest,
			&Manifest{Name: "memkv", Version: "1.0", Model: ModelSingle, MaxInstances: 1, Ops: 0x3fe, Features: FeaturePartitions, MaxScanBatch: 1000}),
		resp("init-response-abi-1.1", OpInit,
			"OK, manifest: name \"memkv\", version \"1.1\", abi_minor 1, model single, max_instances 1, ops 0xffe (INIT..RECLAIM), features 1 (partitions), max_commit_ops 0, max_commit_bytes 0, max_scan_batch 1000",
			AppendManifest(nil, &Manifest{Name: "memkv", Version: "1.1", ABIMinor: 1, Model: ModelSingle, MaxInstances: 1, Ops: 0xffe, Features: FeaturePartitions, MaxScanBatch: 1000}),
			decodeManifest,
			&Manifest{Name: "memkv", Version: "1.1", ABIMinor: 1, Model: ModelSingle, MaxInstances: 1, Ops: 0xffe, Features: FeaturePartitions, MaxScanBatch: 1000}),
		resp("get-response-ok", OpGet, "OK, value \"hello\"",
			AppendValue(nil, []byte("hello")),
			func(b []byte) (any, error) {
				body, err := split(StatusOK)(b)
				if err != nil {
					return nil, err
				}
				return DecodeValue(body)
			}, []byte("hello")),
		resp("get-response-not-found", OpGet, "NOT_FOUND",
			AppendStatus(nil, StatusNotFound),
			func(b []byte) (any, error) {
				body, err := split(StatusNotFound)(b)
				if err != nil {
					return nil, err
				}
				return body, DecodeEmpty(body)
			}, []byte{}),
		resp("scan-open-response", OpScanOpen, "OK, scan_id 1, pairs a=1 b=\"\", more true",
			AppendScanOpened(nil, 1, []Pair{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte("b"), Value: []byte{}}}, true),
			func(b []byte) (any, error) {
				body, err := split(StatusOK)(b)
				if err != nil {
					return nil, err
				}
				id, pairs, more, err := DecodeScanOpened(body, nil)
				return opened{id, pairs, more}, err
			}, opened{1, []Pair{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte("b"), Value: []byte{}}}, true}),
		resp("scan-next-response-last", OpScanNext, "OK, no pairs, more false (scan released)",
			append(AppendStatus(nil, StatusOK), AppendBatch(nil, nil, false)...),
			func(b []byte) (any, error) {
				body, err := split(StatusOK)(b)
				if err != nil {
					return nil, err
				}
				pairs, more, err := DecodeBatch(body, nil)
				return opened{0, pairs, more}, err
			}, opened{0, nil, false}),
		resp("commit-response-conflict", OpCommit, "CONFLICT, index 3, exists true, current \"cur\"",
			AppendConflict(nil, 3, true, []byte("cur")),
			func(b []byte) (any, error) {
				body, err := split(StatusConflict)(b)
				if err != nil {
					return nil, err
				}
				i, e, c, err := DecodeConflict(body)
				return conflict{i, e, c}, err
			}, conflict{3, true, []byte("cur")}),
		resp("commit-response-uncertain", OpCommit, "UNCERTAIN, message \"timeout\"",
			AppendError(nil, StatusUncertain, "timeout"),
			func(b []byte) (any, error) {
				body, err := split(StatusUncertain)(b)
				if err != nil {
					return nil, err
				}
				return DecodeMessage(body)
			}, []byte("timeout")),
		resp("partitions-response", OpPartitions, "OK, ranges [\"\", \"m\") [\"m\", \"\")",
			AppendPartitions(nil, []Range{{Start: []byte{}, End: []byte("m")}, {Start: []byte("m"), End: []byte{}}}),
			func(b []byte) (any, error) {
				body, err := split(StatusOK)(b)
				if err != nil {
					return nil, err
				}
				return DecodePartitions(body, nil)
			}, []Range{{Start: []byte{}, End: []byte("m")}, {Start: []byte("m"), End: []byte{}}}),
		resp("size-response", OpSize, "OK, bytes 5368709120 (5 GiB, more than 32 bits)",
			AppendSize(nil, 5<<30),
			func(b []byte) (any, error) {
				body, err := split(StatusOK)(b)
				if err != nil {
					return nil, err
				}
				return DecodeSize(body)
			}, int64(5<<30)),
		resp("reclaim-response-ok", OpReclaim, "OK, no body",
			AppendOK(nil),
			func(b []byte) (any, error) {
				body, err := split(StatusOK)(b)
				if err != nil {
					return nil, err
				}
				return body, DecodeEmpty(body)
			}, []byte{}),
		resp("reclaim-response-deadline", OpReclaim, "DEADLINE, message \"vacuum ran past the deadline\"",
			AppendError(nil, StatusDeadline, "vacuum ran past the deadline"),
			func(b []byte) (any, error) {
				body, err := split(StatusDeadline)(b)
				if err != nil {
					return nil, err
				}
				return DecodeMessage(body)
			}, []byte("vacuum ran past the deadline")),
	}
}

// TestGoldenVectors checks that the codec produces exactly the bytes of
// every vector in testdata/vectors.json and decodes them back to the same
// values. Run with -update after a deliberate change (a new vector); a
// change to an existing vector's bytes is a breaking change of the ABI.
func TestGoldenVectors(t *testing.T) {
	cases := golden()
	if *update {
		var out []Vector
		for _, c := range cases {
			c.Hex = hex.EncodeToString(c.encode())
			out = append(out, c.Vector)
		}
		b, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(VectorsPath, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(VectorsPath)
	if err != nil {
		t.Fatal(err)
	}
	var vectors []Vector
	if err := json.Unmarshal(raw, &vectors); err != nil {
		t.Fatal(err)
	}
	byName := map[string]Vector{}
	for _, v := range vectors {
		byName[v.Name] = v
	}
	if len(byName) != len(cases) {
		t.Errorf("%s has %d vectors, the test defines %d", VectorsPath, len(byName), len(cases))
	}
	for _, c := range cases {
		v, ok := byName[c.Name]
		if !ok {
			t.Errorf("vector %s missing from %s", c.Name, VectorsPath)
			continue
		}
		want, err := hex.DecodeString(v.Hex)
		if err != nil {
			t.Errorf("%s: bad hex: %v", c.Name, err)
			continue
		}
		if got := c.encode(); !bytes.Equal(got, want) {
			t.Errorf("%s: encoded %x, vector says %x", c.Name, got, want)
		}
		got, err := c.decode(want)
		if err != nil {
			t.Errorf("%s: decode: %v", c.Name, err)
			continue
		}
		if !equalLoose(got, c.value) {
			t.Errorf("%s: decoded %#v, want %#v", c.Name, got, c.value)
		}
	}
}

// equalLoose compares decoded values treating nil and empty byte slices as
// equal, as the ABI does.
func equalLoose(a, b any) bool {
	return reflect.DeepEqual(normalize(reflect.ValueOf(a)), normalize(reflect.ValueOf(b)))
}

func normalize(v reflect.Value) any {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return normalize(v.Elem())
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return string(v.Bytes())
		}
		out := make([]any, v.Len())
		for i := range out {
			out[i] = normalize(v.Index(i))
		}
		return out
	case reflect.Struct:
		out := make([]any, v.NumField())
		for i := range out {
			out[i] = normalize(v.Field(i))
		}
		return out
	}
	return v.Interface()
}
