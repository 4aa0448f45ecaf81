package sdk

import (
	"fmt"

	"github.com/engramkv/engram/wasm/abi"
)

// size answers SIZE from the store's Sizer.
func (d *dispatcher) size(req []byte) []byte {
	var m abi.EmptyRequest
	if err := m.Decode(req); err != nil {
		return d.badRequest(abi.OpSize, err)
	}
	sz, ok := d.store.(Sizer)
	if !ok {
		return d.fail(abi.StatusUnsupported, "SIZE: the store does not implement sdk.Sizer")
	}
	n, err := sz.Size(d.requestContext(m.Header))
	if err != nil {
		return d.failErr(fmt.Errorf("size: %w", err))
	}
	d.resp = abi.AppendSize(d.resp[:0], n)
	return d.resp
}

// reclaim answers RECLAIM from the store's Reclaimer.
func (d *dispatcher) reclaim(req []byte) []byte {
	var m abi.EmptyRequest
	if err := m.Decode(req); err != nil {
		return d.badRequest(abi.OpReclaim, err)
	}
	rc, ok := d.store.(Reclaimer)
	if !ok {
		return d.fail(abi.StatusUnsupported, "RECLAIM: the store does not implement sdk.Reclaimer")
	}
	if err := rc.Reclaim(d.requestContext(m.Header)); err != nil {
		return d.failErr(fmt.Errorf("reclaim: %w", err))
	}
	return abi.AppendOK(d.resp[:0])
}
