package mvcc

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/engramkv/engram/core/kv"
)

// Version is the metadata of one version of a key (its record's header).
// The revision key holds the header of the latest version; each object key
// holds its version's header followed by the value, so a read at a past
// revision needs nothing else. It is exported, with Change, for package
// transfer (layout.go).
type Version struct {
	ModRev int64
	// Sub is the version's index among the changes of its revision (etcd's
	// sub revision). Nothing in Engram's own layout needs it; etcd's
	// snapshot file and HashKV name every version by (ModRev, Sub).
	Sub       int64
	CreateRev int64
	Version   int64
	Lease     int64
	Tombstone bool
}

const (
	// recordFormat is the format of change-log and lease records, and of
	// version records written before sub revisions were kept.
	recordFormat = 1
	// versionFormat is the format of version records: recordFormat's
	// header plus the sub revision.
	versionFormat = 2
	flagTombstone = 1 << 0
)

var errBadRecord = errors.New("mvcc: malformed record")

// maxHeaderLen is the longest header appendHeader writes.
const maxHeaderLen = 2 + 5*binary.MaxVarintLen64

// appendHeader encodes h: a format byte, a flags byte and five uvarints
// (the sub revision last; usually 0, so one byte).
func appendHeader(dst []byte, h Version) []byte {
	var flags byte
	if h.Tombstone {
		flags |= flagTombstone
	}
	dst = append(dst, versionFormat, flags)
	dst = binary.AppendUvarint(dst, uint64(h.ModRev))
	dst = binary.AppendUvarint(dst, uint64(h.CreateRev))
	dst = binary.AppendUvarint(dst, uint64(h.Version))
	dst = binary.AppendUvarint(dst, uint64(h.Lease))
	dst = binary.AppendUvarint(dst, uint64(h.Sub))
	return dst
}

// encodeObject encodes a version record: header then value.
func encodeObject(h Version, value []byte) []byte {
	dst := appendHeader(make([]byte, 0, objectLen(value)), h)
	return append(dst, value...)
}

// objectLen bounds the length of a version record of value.
func objectLen(value []byte) int { return 2 + 5*5 + len(value) }

// subUnknown marks a header decoded from a record written before sub
// revisions were kept (recordFormat); export then takes the sub revision
// from the change log while it still holds the version's revision.
const subUnknown = -1

// decodeRead decodes a record the store answered a read of op with: found
// is false when it holds none (kv.ErrNotFound); a failed read is a storage
// error.
func decodeRead(raw []byte, readErr error, op string) (h Version, value []byte, found bool, err error) {
	switch {
	case errors.Is(readErr, kv.ErrNotFound):
		return h, nil, false, nil
	case readErr != nil:
		return h, nil, false, storageErr(op, readErr)
	}
	h, value, err = decodeHeader(raw)
	return h, value, err == nil, err
}

// decodeHeader decodes a header and returns the bytes after it (the value of
// an object record).
func decodeHeader(b []byte) (Version, []byte, error) {
	var h Version
	if len(b) < 2 {
		return h, nil, fmt.Errorf("%w: %d bytes", errBadRecord, len(b))
	}
	if b[0] != recordFormat && b[0] != versionFormat {
		return h, nil, fmt.Errorf("%w: unknown format %d", errBadRecord, b[0])
	}
	format := b[0]
	h.Tombstone = b[1]&flagTombstone != 0
	b = b[2:]
	fields := [5]*int64{&h.ModRev, &h.CreateRev, &h.Version, &h.Lease, &h.Sub}
	count := len(fields)
	if format == recordFormat {
		count--
		h.Sub = subUnknown
	}
	for i, f := range fields[:count] {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return h, nil, fmt.Errorf("%w: field %d", errBadRecord, i)
		}
		*f = int64(v)
		b = b[n:]
	}
	return h, b, nil
}

// Change is one key's change in a revision, as kept in the change log.
type Change struct {
	Deleted bool
	Key     []byte
	// PrevRev is the revision of the key's previous live version, or 0 when
	// the change created the key. It lets a watch from history fill prev_kv
	// with one point read.
	PrevRev int64
	// Superseded is the version record of a put that a later change of the
	// same key in the same revision replaced: history keeps only a
	// revision's last version, so a watch from history reads this one here.
	Superseded []byte
}

// encodeChanges encodes the change-log record of one revision.
func encodeChanges(cs []Change) []byte {
	return appendChanges(make([]byte, 0, changesLen(cs)), cs)
}

// changesLen bounds the length of the change-log record of cs.
func changesLen(cs []Change) int {
	n := 2
	for _, c := range cs {
		n += 1 + binary.MaxVarintLen64*3 + len(c.Key) + len(c.Superseded)
	}
	return n
}

// appendChanges appends the change-log record of cs to dst.
func appendChanges(dst []byte, cs []Change) []byte {
	dst = append(dst, recordFormat)
	dst = binary.AppendUvarint(dst, uint64(len(cs)))
	for _, c := range cs {
		var t byte
		switch {
		case c.Deleted:
			t = 1
		case c.Superseded != nil:
			t = 2
		}
		dst = append(dst, t)
		dst = binary.AppendUvarint(dst, uint64(len(c.Key)))
		dst = append(dst, c.Key...)
		dst = binary.AppendUvarint(dst, uint64(c.PrevRev))
		if t == 2 {
			dst = binary.AppendUvarint(dst, uint64(len(c.Superseded)))
			dst = append(dst, c.Superseded...)
		}
	}
	return dst
}

// changeCount returns the number of changes a change-log record holds,
// and where they start, without decoding them.
func changeCount(b []byte) (int, []byte, error) {
	if len(b) < 1 || b[0] != recordFormat {
		return 0, nil, fmt.Errorf("%w: change log format", errBadRecord)
	}
	b = b[1:]
	cnt, n := binary.Uvarint(b)
	if n <= 0 || cnt > uint64(len(b)) {
		return 0, nil, fmt.Errorf("%w: change count", errBadRecord)
	}
	return int(cnt), b[n:], nil
}

func decodeChanges(b []byte) ([]Change, error) {
	cnt, b, err := changeCount(b)
	if err != nil {
		return nil, err
	}
	cs := make([]Change, 0, cnt)
	for i := range cnt {
		if len(b) < 1 {
			return nil, fmt.Errorf("%w: change %d truncated", errBadRecord, i)
		}
		t := b[0]
		c := Change{Deleted: t == 1}
		b = b[1:]
		kl, n := binary.Uvarint(b)
		if n <= 0 || kl > uint64(len(b)-n) {
			return nil, fmt.Errorf("%w: change %d key", errBadRecord, i)
		}
		c.Key = b[n : n+int(kl)]
		b = b[n+int(kl):]
		pr, n := binary.Uvarint(b)
		if n <= 0 {
			return nil, fmt.Errorf("%w: change %d prev revision", errBadRecord, i)
		}
		c.PrevRev = int64(pr)
		b = b[n:]
		if t == 2 {
			vl, n := binary.Uvarint(b)
			if n <= 0 || vl > uint64(len(b)-n) {
				return nil, fmt.Errorf("%w: change %d superseded version", errBadRecord, i)
			}
			c.Superseded = b[n : n+int(vl)]
			b = b[n+int(vl):]
		}
		cs = append(cs, c)
	}
	return cs, nil
}

// leaseRecord is the durable part of a lease: its ID and granted TTL. Expiry
// is not stored: like etcd, a restarted server gives every lease its full TTL
// again, so a restart never expires a lease early.
func encodeLease(ttl int64) []byte {
	return binary.AppendUvarint([]byte{recordFormat}, uint64(ttl))
}

func decodeLease(b []byte) (int64, error) {
	if len(b) < 2 || b[0] != recordFormat {
		return 0, fmt.Errorf("%w: lease record", errBadRecord)
	}
	v, n := binary.Uvarint(b[1:])
	if n <= 0 {
		return 0, fmt.Errorf("%w: lease ttl", errBadRecord)
	}
	return int64(v), nil
}
