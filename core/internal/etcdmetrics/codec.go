package etcdmetrics

import (
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the codec countingCodec wraps
	"google.golang.org/grpc/mem"
)

// countingCodec is gRPC's proto codec counting the payload bytes of
// client messages for etcd_network_client_grpc_{sent,received}_bytes_total
// as etcd's own codec does: a message sent when it is encoded, one
// received once it is decoded.
type countingCodec struct {
	encoding.CodecV2
	m *Metrics
}

// Codec returns gRPC's proto codec counting the client bytes, for
// grpc.ForceServerCodecV2.
func (m *Metrics) Codec() encoding.CodecV2 {
	return countingCodec{CodecV2: encoding.GetCodecV2("proto"), m: m}
}

func (c countingCodec) Marshal(v any) (mem.BufferSlice, error) {
	out, err := c.CodecV2.Marshal(v)
	if err == nil {
		c.m.sentBytes.Add(float64(out.Len()))
	}
	return out, err
}

func (c countingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil {
		c.m.receivedBytes.Add(float64(data.Len()))
	}
	return err
}
