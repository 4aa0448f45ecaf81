package mvcc

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// header is the metadata of one version of a key. The revision key holds the
// header of the latest version; each object key holds its version's header
// followed by the value, so a read at a past revision needs nothing else.
type header struct {
	modRev int64
	// sub is the version's index among the changes of its revision (etcd's
	// sub revision). Nothing in Engram's own layout needs it; etcd's
	// snapshot file and HashKV name every version by (modRev, sub).
	sub       int64
	createRev int64
	version   int64
	lease     int64
	tombstone bool
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
func appendHeader(dst []byte, h header) []byte {
	var flags byte
	if h.tombstone {
		flags |= flagTombstone
	}
	dst = append(dst, versionFormat, flags)
	dst = binary.AppendUvarint(dst, uint64(h.modRev))
	dst = binary.AppendUvarint(dst, uint64(h.createRev))
	dst = binary.AppendUvarint(dst, uint64(h.version))
	dst = binary.AppendUvarint(dst, uint64(h.lease))
	dst = binary.AppendUvarint(dst, uint64(h.sub))
	return dst
}

// encodeObject encodes a version record: header then value.
func encodeObject(h header, value []byte) []byte {
	dst := appendHeader(make([]byte, 0, objectLen(value)), h)
	return append(dst, value...)
}

// objectLen bounds the length of a version record of value.
func objectLen(value []byte) int { return 2 + 5*5 + len(value) }

// subUnknown marks a header decoded from a record written before sub
// revisions were kept (recordFormat); export then takes the sub revision
// from the change log while it still holds the version's revision.
const subUnknown = -1

// decodeHeader decodes a header and returns the bytes after it (the value of
// an object record).
func decodeHeader(b []byte) (header, []byte, error) {
	var h header
	if len(b) < 2 {
		return h, nil, fmt.Errorf("%w: %d bytes", errBadRecord, len(b))
	}
	if b[0] != recordFormat && b[0] != versionFormat {
		return h, nil, fmt.Errorf("%w: unknown format %d", errBadRecord, b[0])
	}
	format := b[0]
	h.tombstone = b[1]&flagTombstone != 0
	b = b[2:]
	fields := [5]*int64{&h.modRev, &h.createRev, &h.version, &h.lease, &h.sub}
	count := len(fields)
	if format == recordFormat {
		count--
		h.sub = subUnknown
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

// change is one key's change in a revision, as kept in the change log.
type change struct {
	deleted bool
	key     []byte
	// prevRev is the revision of the key's previous live version, or 0 when
	// the change created the key. It lets a watch from history fill prev_kv
	// with one point read.
	prevRev int64
	// superseded is the version record of a put that a later change of the
	// same key in the same revision replaced: history keeps only a
	// revision's last version, so a watch from history reads this one here.
	superseded []byte
}

// encodeChanges encodes the change-log record of one revision.
func encodeChanges(cs []change) []byte {
	return appendChanges(make([]byte, 0, changesLen(cs)), cs)
}

// changesLen bounds the length of the change-log record of cs.
func changesLen(cs []change) int {
	n := 2
	for _, c := range cs {
		n += 1 + binary.MaxVarintLen64*3 + len(c.key) + len(c.superseded)
	}
	return n
}

// appendChanges appends the change-log record of cs to dst.
func appendChanges(dst []byte, cs []change) []byte {
	dst = append(dst, recordFormat)
	dst = binary.AppendUvarint(dst, uint64(len(cs)))
	for _, c := range cs {
		var t byte
		switch {
		case c.deleted:
			t = 1
		case c.superseded != nil:
			t = 2
		}
		dst = append(dst, t)
		dst = binary.AppendUvarint(dst, uint64(len(c.key)))
		dst = append(dst, c.key...)
		dst = binary.AppendUvarint(dst, uint64(c.prevRev))
		if t == 2 {
			dst = binary.AppendUvarint(dst, uint64(len(c.superseded)))
			dst = append(dst, c.superseded...)
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

func decodeChanges(b []byte) ([]change, error) {
	cnt, b, err := changeCount(b)
	if err != nil {
		return nil, err
	}
	cs := make([]change, 0, cnt)
	for i := range cnt {
		if len(b) < 1 {
			return nil, fmt.Errorf("%w: change %d truncated", errBadRecord, i)
		}
		t := b[0]
		c := change{deleted: t == 1}
		b = b[1:]
		kl, n := binary.Uvarint(b)
		if n <= 0 || kl > uint64(len(b)-n) {
			return nil, fmt.Errorf("%w: change %d key", errBadRecord, i)
		}
		c.key = b[n : n+int(kl)]
		b = b[n+int(kl):]
		pr, n := binary.Uvarint(b)
		if n <= 0 {
			return nil, fmt.Errorf("%w: change %d prev revision", errBadRecord, i)
		}
		c.prevRev = int64(pr)
		b = b[n:]
		if t == 2 {
			vl, n := binary.Uvarint(b)
			if n <= 0 || vl > uint64(len(b)-n) {
				return nil, fmt.Errorf("%w: change %d superseded version", errBadRecord, i)
			}
			c.superseded = b[n : n+int(vl)]
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
