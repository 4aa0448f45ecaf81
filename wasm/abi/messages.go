package abi

// This file holds the message layouts of ABI.md, section "Messages". Each
// request type has Append (encode after the buffer's current contents) and
// Decode (alias the input; no allocation except where a slice of elements is
// decoded into a caller-provided one). The handshake messages (InitRequest,
// Manifest) are extensible: a decoder ignores trailing bytes it does not
// know. Every other message has a fixed layout within a major version and a
// decoder rejects trailing bytes, which catches a wrong length early.

// Header starts every request body.
type Header struct {
	// Deadline is the request's deadline in nanoseconds since the Unix
	// epoch (the host's wall clock), or 0 for none. The host also enforces
	// it on every socket operation; plugins use it to bound their own
	// work.
	Deadline int64
}

func (h Header) append(b []byte) []byte { return AppendUvarint(b, uint64(h.Deadline)) }

func (h *Header) decode(r *Reader) { h.Deadline = r.Int64() }

// InitRequest is the body of OpInit: the handshake that configures a fresh
// instance.
type InitRequest struct {
	Header
	// Config is the operator's plugin configuration, passed through
	// verbatim (storage.wasm.config).
	Config []byte
	// HostFlags are HostFlag* bits.
	HostFlags uint64
	// Instance is this instance's index in its pool (0 for ModelSingle);
	// a replacement instance reuses the index of the one it replaces.
	Instance uint32
	// MaxResponse is the largest response, in bytes, the host accepts.
	// A plugin keeps scan batches below it.
	MaxResponse uint32
}

// Append encodes m after b.
func (m *InitRequest) Append(b []byte) []byte {
	b = m.Header.append(b)
	b = AppendBytes(b, m.Config)
	b = AppendUvarint(b, m.HostFlags)
	b = AppendUvarint(b, uint64(m.Instance))
	return AppendUvarint(b, uint64(m.MaxResponse))
}

// Decode decodes m from b, ignoring trailing fields of later minors.
func (m *InitRequest) Decode(b []byte) error {
	r := NewReader(b)
	m.Header.decode(&r)
	m.Config = r.Bytes()
	m.HostFlags = r.Uvarint()
	m.Instance = r.Uint32()
	m.MaxResponse = r.Uint32()
	return r.Err()
}

// Manifest is the body of an OK response to OpInit: what the plugin is and
// what it supports.
type Manifest struct {
	// Name identifies the engine (kv.Features.Name); required.
	Name string
	// Version is the plugin's own version, free-form.
	Version string
	// ABIMinor is the ABI minor the plugin was built against.
	ABIMinor uint32
	// Model is the instance model.
	Model Model
	// MaxInstances caps the pool (0: no cap). ModelSingle implies 1.
	MaxInstances uint32
	// Ops has bit Op.Bit() set for every op the plugin handles; it must
	// include RequiredOps.
	Ops uint64
	// Features are Feature* bits.
	Features uint64
	// MaxCommitOps caps the ops of one COMMIT (0: no cap).
	MaxCommitOps uint32
	// MaxCommitBytes caps the encoded size of one COMMIT request (0: no
	// cap).
	MaxCommitBytes uint32
	// MaxScanBatch caps the pairs of one scan batch (0: no cap).
	MaxScanBatch uint32
}

// Append encodes m after b (without the status byte).
func (m *Manifest) Append(b []byte) []byte {
	b = AppendString(b, m.Name)
	b = AppendString(b, m.Version)
	b = AppendUvarint(b, uint64(m.ABIMinor))
	b = append(b, byte(m.Model))
	b = AppendUvarint(b, uint64(m.MaxInstances))
	b = AppendUvarint(b, m.Ops)
	b = AppendUvarint(b, m.Features)
	b = AppendUvarint(b, uint64(m.MaxCommitOps))
	b = AppendUvarint(b, uint64(m.MaxCommitBytes))
	return AppendUvarint(b, uint64(m.MaxScanBatch))
}

// Decode decodes m from b, ignoring trailing fields of later minors. It
// checks encoding only; the host validates the values.
func (m *Manifest) Decode(b []byte) error {
	r := NewReader(b)
	m.Name = r.String()
	m.Version = r.String()
	m.ABIMinor = r.Uint32()
	m.Model = Model(r.Byte())
	m.MaxInstances = r.Uint32()
	m.Ops = r.Uvarint()
	m.Features = r.Uvarint()
	m.MaxCommitOps = r.Uint32()
	m.MaxCommitBytes = r.Uint32()
	m.MaxScanBatch = r.Uint32()
	return r.Err()
}

// Supports reports whether the manifest declares op.
func (m *Manifest) Supports(op Op) bool { return m.Ops&op.Bit() != 0 }

// GetRequest is the body of OpGet.
type GetRequest struct {
	Header
	Key []byte
}

// Append encodes m after b.
func (m *GetRequest) Append(b []byte) []byte {
	return AppendBytes(m.Header.append(b), m.Key)
}

// Decode decodes m from b.
func (m *GetRequest) Decode(b []byte) error {
	r := NewReader(b)
	m.Header.decode(&r)
	m.Key = r.Bytes()
	return r.Finish()
}

// Scan flags.
const (
	// ScanReverse yields keys in descending order from the last key < End.
	ScanReverse = 1 << 0
	scanFlags   = ScanReverse
)

// ScanOpenRequest is the body of OpScanOpen.
type ScanOpenRequest struct {
	Header
	// Start is the inclusive lower bound; empty means the first key.
	Start []byte
	// End is the exclusive upper bound; empty means no upper bound.
	End []byte
	// Reverse yields keys in descending order.
	Reverse bool
	// Limit caps the pairs of the whole scan; 0 means no limit.
	Limit uint64
	// BatchSize caps the pairs of the first batch; 0 lets the plugin
	// choose.
	BatchSize uint32
}

// Append encodes m after b.
func (m *ScanOpenRequest) Append(b []byte) []byte {
	b = m.Header.append(b)
	b = AppendBytes(b, m.Start)
	b = AppendBytes(b, m.End)
	var flags byte
	if m.Reverse {
		flags |= ScanReverse
	}
	b = append(b, flags)
	b = AppendUvarint(b, m.Limit)
	return AppendUvarint(b, uint64(m.BatchSize))
}

// Decode decodes m from b.
func (m *ScanOpenRequest) Decode(b []byte) error {
	r := NewReader(b)
	m.Header.decode(&r)
	m.Start = r.Bytes()
	m.End = r.Bytes()
	flags := r.Byte()
	m.Reverse = flags&ScanReverse != 0
	m.Limit = r.Uvarint()
	m.BatchSize = r.Uint32()
	if err := r.Finish(); err != nil {
		return err
	}
	if flags&^scanFlags != 0 {
		return ErrBadValue
	}
	return nil
}

// ScanNextRequest is the body of OpScanNext.
type ScanNextRequest struct {
	Header
	ID        uint64
	BatchSize uint32
}

// Append encodes m after b.
func (m *ScanNextRequest) Append(b []byte) []byte {
	b = m.Header.append(b)
	b = AppendUvarint(b, m.ID)
	return AppendUvarint(b, uint64(m.BatchSize))
}

// Decode decodes m from b.
func (m *ScanNextRequest) Decode(b []byte) error {
	r := NewReader(b)
	m.Header.decode(&r)
	m.ID = r.Uvarint()
	m.BatchSize = r.Uint32()
	return r.Finish()
}

// ScanCloseRequest is the body of OpScanClose.
type ScanCloseRequest struct {
	Header
	ID uint64
}

// Append encodes m after b.
func (m *ScanCloseRequest) Append(b []byte) []byte {
	return AppendUvarint(m.Header.append(b), m.ID)
}

// Decode decodes m from b.
func (m *ScanCloseRequest) Decode(b []byte) error {
	r := NewReader(b)
	m.Header.decode(&r)
	m.ID = r.Uvarint()
	return r.Finish()
}

// CommitOp is one write of a COMMIT. Its fields mirror kv.Op.
type CommitOp struct {
	Kind OpKind
	Key  []byte
	// Value is the new value of KindPut, KindPutIfAbsent and
	// KindCompareAndSwap.
	Value []byte
	// Expected is the value KindCompareAndSwap and KindCompareAndDelete
	// require.
	Expected []byte
}

// AppendCommitOp appends one op of a COMMIT body. Fields the kind does not
// carry are not encoded.
func AppendCommitOp(b []byte, kind OpKind, key, value, expected []byte) []byte {
	b = append(b, byte(kind))
	b = AppendBytes(b, key)
	if kind.HasExpected() {
		b = AppendBytes(b, expected)
	}
	if kind.HasValue() {
		b = AppendBytes(b, value)
	}
	return b
}

// CommitOpLen is the encoded size of one op.
func CommitOpLen(kind OpKind, key, value, expected []byte) int {
	n := 1 + BytesLen(len(key))
	if kind.HasExpected() {
		n += BytesLen(len(expected))
	}
	if kind.HasValue() {
		n += BytesLen(len(value))
	}
	return n
}

// AppendCommitHead appends the start of a COMMIT body: the header and the op
// count. AppendCommitOp appends each of the count ops after it.
func AppendCommitHead(b []byte, h Header, count int) []byte {
	return AppendUvarint(h.append(b), uint64(count))
}

// CommitRequest is the body of OpCommit.
type CommitRequest struct {
	Header
	Ops []CommitOp
}

// Append encodes m after b.
func (m *CommitRequest) Append(b []byte) []byte {
	b = AppendCommitHead(b, m.Header, len(m.Ops))
	for i := range m.Ops {
		op := &m.Ops[i]
		b = AppendCommitOp(b, op.Kind, op.Key, op.Value, op.Expected)
	}
	return b
}

// Decode decodes m from b, reusing m.Ops' backing array. Kinds outside
// KindPut..KindCompareAndDelete are ErrBadValue; the other structural rules
// (non-empty keys, no key twice) are the plugin's to check, as kv's
// ValidateBatch does, so that it can answer INVALID with a precise message.
func (m *CommitRequest) Decode(b []byte) error {
	r := NewReader(b)
	m.Header.decode(&r)
	// The smallest op is a DELETE of an empty key: 2 bytes.
	n := r.Count(2)
	m.Ops = m.Ops[:0]
	for i := 0; i < n && r.err == nil; i++ {
		kind := OpKind(r.Byte())
		if r.err == nil && (kind < KindPut || kind > KindCompareAndDelete) {
			r.fail(ErrBadValue)
			break
		}
		op := CommitOp{Kind: kind, Key: r.Bytes()}
		if kind.HasExpected() {
			op.Expected = r.Bytes()
		}
		if kind.HasValue() {
			op.Value = r.Bytes()
		}
		m.Ops = append(m.Ops, op)
	}
	return r.Finish()
}

// PartitionsRequest is the body of OpPartitions.
type PartitionsRequest struct {
	Header
	Start, End []byte
	// MaxParts caps the number of ranges; 0 lets the plugin choose.
	MaxParts uint32
}

// Append encodes m after b.
func (m *PartitionsRequest) Append(b []byte) []byte {
	b = m.Header.append(b)
	b = AppendBytes(b, m.Start)
	b = AppendBytes(b, m.End)
	return AppendUvarint(b, uint64(m.MaxParts))
}

// Decode decodes m from b.
func (m *PartitionsRequest) Decode(b []byte) error {
	r := NewReader(b)
	m.Header.decode(&r)
	m.Start = r.Bytes()
	m.End = r.Bytes()
	m.MaxParts = r.Uint32()
	return r.Finish()
}

// EmptyRequest is the body of OpClose, OpIdle, OpSize and OpReclaim: the
// header alone.
type EmptyRequest struct {
	Header
}

// Append encodes m after b.
func (m *EmptyRequest) Append(b []byte) []byte { return m.Header.append(b) }

// Decode decodes m from b.
func (m *EmptyRequest) Decode(b []byte) error {
	r := NewReader(b)
	m.Header.decode(&r)
	return r.Finish()
}

// DecodeHeader decodes the header of any request body, for a plugin that
// must answer an op it does not know (UNSUPPORTED) or wants the deadline
// before decoding the rest.
func DecodeHeader(b []byte) (Header, error) {
	r := NewReader(b)
	var h Header
	h.decode(&r)
	return h, r.Err()
}

// Pair is one key and value of a scan batch.
type Pair struct {
	Key   []byte
	Value []byte
}

// Range is a half-open key range [Start, End); an empty End is unbounded.
type Range struct {
	Start []byte
	End   []byte
}

// SplitResponse splits a response into its status and body. An empty
// response or an unknown status is an error: the host treats both as a
// protocol violation.
func SplitResponse(b []byte) (Status, []byte, error) {
	if len(b) == 0 {
		return 0, nil, ErrShort
	}
	st := Status(b[0])
	if !st.Valid() {
		return st, nil, ErrBadValue
	}
	return st, b[1:], nil
}

// AppendStatus appends a status byte: the start of every response.
func AppendStatus(b []byte, st Status) []byte { return append(b, byte(st)) }

// AppendError appends a whole error response: status and message. Use it
// for every status whose HasMessage is true.
func AppendError(b []byte, st Status, msg string) []byte {
	return AppendString(append(b, byte(st)), msg)
}

// DecodeMessage decodes the body of an error response.
func DecodeMessage(body []byte) ([]byte, error) {
	r := NewReader(body)
	msg := r.Bytes()
	return msg, r.Finish()
}

// AppendValue appends the OK response of OpGet.
func AppendValue(b, value []byte) []byte {
	return AppendBytes(append(b, byte(StatusOK)), value)
}

// DecodeValue decodes the body of an OK response to OpGet.
func DecodeValue(body []byte) ([]byte, error) {
	r := NewReader(body)
	v := r.Bytes()
	return v, r.Finish()
}

// AppendBatch appends a scan batch (the body of an OK response to
// OpScanNext, and the tail of one to OpScanOpen): the pairs, then whether
// more may follow. more=false tells the host the plugin has released the
// scan.
func AppendBatch(b []byte, pairs []Pair, more bool) []byte {
	b = AppendUvarint(b, uint64(len(pairs)))
	for i := range pairs {
		b = AppendBytes(b, pairs[i].Key)
		b = AppendBytes(b, pairs[i].Value)
	}
	return appendBool(b, more)
}

// BatchLen is the encoded size of a batch of pairs.
func BatchLen(pairs []Pair) int {
	n := UvarintLen(uint64(len(pairs))) + 1
	for i := range pairs {
		n += BytesLen(len(pairs[i].Key)) + BytesLen(len(pairs[i].Value))
	}
	return n
}

// AppendScanOpened appends the whole OK response of OpScanOpen.
func AppendScanOpened(b []byte, id uint64, pairs []Pair, more bool) []byte {
	b = AppendUvarint(append(b, byte(StatusOK)), id)
	return AppendBatch(b, pairs, more)
}

// DecodeScanOpened decodes the body of an OK response to OpScanOpen,
// appending the pairs (aliasing body) to dst.
func DecodeScanOpened(body []byte, dst []Pair) (id uint64, pairs []Pair, more bool, err error) {
	r := NewReader(body)
	id = r.Uvarint()
	pairs, more = decodeBatch(&r, dst)
	return id, pairs, more, r.Finish()
}

// DecodeBatch decodes the body of an OK response to OpScanNext, appending
// the pairs (aliasing body) to dst.
func DecodeBatch(body []byte, dst []Pair) (pairs []Pair, more bool, err error) {
	r := NewReader(body)
	pairs, more = decodeBatch(&r, dst)
	return pairs, more, r.Finish()
}

func decodeBatch(r *Reader, dst []Pair) ([]Pair, bool) {
	n := r.Count(2)
	for i := 0; i < n && r.err == nil; i++ {
		k := r.Bytes()
		v := r.Bytes()
		dst = append(dst, Pair{Key: k, Value: v})
	}
	more := r.Bool()
	return dst, more
}

// AppendConflict appends the whole CONFLICT response of OpCommit: the index
// of the first op whose condition failed, whether its key exists, and the
// key's current value.
func AppendConflict(b []byte, index uint32, exists bool, current []byte) []byte {
	b = AppendUvarint(append(b, byte(StatusConflict)), uint64(index))
	b = appendBool(b, exists)
	return AppendBytes(b, current)
}

// DecodeConflict decodes the body of a CONFLICT response.
func DecodeConflict(body []byte) (index uint32, exists bool, current []byte, err error) {
	r := NewReader(body)
	index = r.Uint32()
	exists = r.Bool()
	current = r.Bytes()
	return index, exists, current, r.Finish()
}

// AppendPartitions appends the whole OK response of OpPartitions.
func AppendPartitions(b []byte, ranges []Range) []byte {
	b = AppendUvarint(append(b, byte(StatusOK)), uint64(len(ranges)))
	for i := range ranges {
		b = AppendBytes(b, ranges[i].Start)
		b = AppendBytes(b, ranges[i].End)
	}
	return b
}

// DecodePartitions decodes the body of an OK response to OpPartitions,
// appending the ranges (aliasing body) to dst.
func DecodePartitions(body []byte, dst []Range) ([]Range, error) {
	r := NewReader(body)
	n := r.Count(2)
	for i := 0; i < n && r.err == nil; i++ {
		s := r.Bytes()
		e := r.Bytes()
		dst = append(dst, Range{Start: s, End: e})
	}
	return dst, r.Finish()
}

// AppendManifest appends the whole OK response of OpInit.
func AppendManifest(b []byte, m *Manifest) []byte {
	return m.Append(append(b, byte(StatusOK)))
}

// AppendSize appends the whole OK response of OpSize: the bytes the
// engine's data takes. A negative n is encoded as 0: a size is never
// negative, and an encoder must not emit an i64 field >= 2^63.
func AppendSize(b []byte, n int64) []byte {
	return AppendUvarint(append(b, byte(StatusOK)), uint64(max(n, 0)))
}

// DecodeSize decodes the body of an OK response to OpSize.
func DecodeSize(body []byte) (int64, error) {
	r := NewReader(body)
	n := r.Int64()
	return n, r.Finish()
}

// AppendOK appends an OK response with an empty body (COMMIT, SCAN_CLOSE,
// CLOSE, IDLE, RECLAIM).
func AppendOK(b []byte) []byte { return append(b, byte(StatusOK)) }

// DecodeEmpty checks that an OK body is empty.
func DecodeEmpty(body []byte) error {
	if len(body) != 0 {
		return ErrTrailing
	}
	return nil
}
