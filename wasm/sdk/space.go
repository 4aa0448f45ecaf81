package sdk

import (
	"context"
	"fmt"
	"strings"

	"github.com/engramkv/engram/wasm/abi"
)

// size answers SIZE from the store's Sizer.
func (d *dispatcher) size(req []byte) []byte {
	sz, ok := d.store.(Sizer)
	return d.optional(req, ok, "sdk.Sizer", func(ctx context.Context) error {
		n, err := sz.Size(ctx)
		d.resp = abi.AppendSize(d.resp[:0], n)
		return err
	})
}

// reclaim answers RECLAIM from the store's Reclaimer.
func (d *dispatcher) reclaim(req []byte) []byte {
	rc, ok := d.store.(Reclaimer)
	return d.optional(req, ok, "sdk.Reclaimer", func(ctx context.Context) error {
		d.resp = abi.AppendOK(d.resp[:0])
		return rc.Reclaim(ctx)
	})
}

// optional answers an op whose request is the header alone and which the
// store serves through an optional interface, iface (implemented says
// whether it does): run does the op and leaves its OK response in d.resp;
// an error it returns replaces that response.
func (d *dispatcher) optional(req []byte, implemented bool, iface string, run func(ctx context.Context) error) []byte {
	ctx, bad := d.decodeEmpty(req)
	if bad != nil {
		return bad
	}
	if !implemented {
		return d.unsupported(iface)
	}
	if err := run(ctx); err != nil {
		// The op's name in lower case ("size", "reclaim") says which call
		// of the store failed.
		return d.failErr(fmt.Errorf("%s: %w", strings.ToLower(d.op.String()), err))
	}
	return d.resp
}
