// Package abi is the contract between Engram and a WebAssembly storage
// plugin: the names of the exports and imports, the op and status codes, and
// the hand-written binary encoding of every message. ABI.md in this directory
// is the normative text; this package is its Go implementation, shared by the
// host (github.com/engramkv/engram/wasm/host) and the Go plugin SDK
// (github.com/engramkv/engram/wasm/sdk), and checked against the golden vectors in
// testdata/ that other languages' implementations check too.
//
// It is its own module with no dependencies and must stay that way: it is
// compiled into every Go plugin (GOOS=wasip1), so it must not import anything
// beyond the standard library's leaf packages, must not allocate on the hot
// paths (decoders alias their input, encoders append to a caller's buffer),
// and must never panic on malformed input (a plugin's response is untrusted
// data to the host, and the host's request is untrusted data to a plugin).
package abi

// Major is the ABI major version this package implements. A host refuses a
// plugin whose kvp_abi_version export returns a major it does not support;
// a breaking change means a new major, which hosts support side by side.
const Major = 1

// Minor is the ABI minor version. Minor versions only add: new ops (feature
// detected through Manifest.Ops), new trailing fields in the handshake
// messages, new feature bits. A plugin reports the minor it was built
// against in Manifest.ABIMinor, for diagnostics only.
const Minor = 1

// Export names a plugin must (or, for Initialize, should) provide.
const (
	// ExportMemory is the plugin's linear memory.
	ExportMemory = "memory"
	// ExportInitialize is the WASI reactor initializer, called once per
	// instance before anything else.
	ExportInitialize = "_initialize"
	// ExportVersion is kvp_abi_version() -> i32: the ABI major.
	ExportVersion = "kvp_abi_version"
	// ExportBuffer is kvp_buffer(min_cap i32) -> i32: a pointer to the
	// plugin-owned request buffer with room for at least min_cap bytes, or
	// 0 if the plugin cannot provide it.
	ExportBuffer = "kvp_buffer"
	// ExportDispatch is kvp_dispatch(op i32, req_len i32) -> i64: handles
	// the request in the buffer and returns resp_ptr<<32 | resp_len.
	ExportDispatch = "kvp_dispatch"
)

// HostModule is the import module of the host functions of this major.
const HostModule = "engram_host_v1"

// Host function names in HostModule. Every one is always present; an
// ungranted capability answers ErrnoDenied.
const (
	// ImportLog is log(level i32, ptr i32, len i32).
	ImportLog = "log"
	// ImportClockNow is clock_now(clock i32) -> i64.
	ImportClockNow = "clock_now"
	// ImportNetDial is net_dial(addr_ptr i32, addr_len i32, timeout_ms i32) -> i32.
	ImportNetDial = "net_dial"
	// ImportNetRead is net_read(handle i32, ptr i32, len i32) -> i32.
	ImportNetRead = "net_read"
	// ImportNetWrite is net_write(handle i32, ptr i32, len i32) -> i32.
	ImportNetWrite = "net_write"
	// ImportNetClose is net_close(handle i32) -> i32.
	ImportNetClose = "net_close"
	// ImportNetSetDeadline is net_set_deadline(handle i32, which i32, unix_ns i64) -> i32.
	ImportNetSetDeadline = "net_set_deadline"
)

// Clock ids of clock_now.
const (
	// ClockRealtime is wall-clock time in nanoseconds since the Unix epoch.
	ClockRealtime = 0
	// ClockMonotonic is a monotonic clock in nanoseconds from an arbitrary
	// origin.
	ClockMonotonic = 1
)

// Deadline selectors of net_set_deadline.
const (
	DeadlineBoth  = 0
	DeadlineRead  = 1
	DeadlineWrite = 2
)

// Errno values returned (negated is not needed: they are negative) by the
// net_* host functions. Non-negative results are handles or byte counts.
const (
	// ErrnoDenied: the capability is not granted, or the address is not
	// on the operator's allow-list.
	ErrnoDenied = -1
	// ErrnoRefused: the peer refused or could not be reached.
	ErrnoRefused = -2
	// ErrnoTimeout: a deadline passed (the plugin's own, or the request's
	// deadline the host applies to every socket operation).
	ErrnoTimeout = -3
	// ErrnoEOF: the peer closed the connection.
	ErrnoEOF = -4
	// ErrnoClosed: the handle is unknown or already closed.
	ErrnoClosed = -5
	// ErrnoInvalid: an argument is out of range (a pointer outside memory,
	// a bad selector).
	ErrnoInvalid = -6
	// ErrnoLimit: too many open connections for this instance.
	ErrnoLimit = -7
	// ErrnoIO: any other I/O error.
	ErrnoIO = -8
)

// ErrnoName returns a short name for a net_* result code.
func ErrnoName(code int32) string {
	switch code {
	case ErrnoDenied:
		return "DENIED"
	case ErrnoRefused:
		return "REFUSED"
	case ErrnoTimeout:
		return "TIMEOUT"
	case ErrnoEOF:
		return "EOF"
	case ErrnoClosed:
		return "CLOSED"
	case ErrnoInvalid:
		return "INVALID"
	case ErrnoLimit:
		return "LIMIT"
	case ErrnoIO:
		return "IO"
	}
	if code >= 0 {
		return "OK"
	}
	return "UNKNOWN"
}

// Log levels of the log import; the values are log/slog's.
const (
	LogDebug = -4
	LogInfo  = 0
	LogWarn  = 4
	LogError = 8
)

// Op is the op code passed to kvp_dispatch.
type Op uint8

// The ops of ABI 1.0 (INIT..IDLE) and 1.1 (SIZE, RECLAIM). Codes are never
// reused; new ops get new codes and are feature-detected through
// Manifest.Ops.
const (
	OpInit       Op = 1
	OpGet        Op = 2
	OpScanOpen   Op = 3
	OpScanNext   Op = 4
	OpScanClose  Op = 5
	OpCommit     Op = 6
	OpPartitions Op = 7
	OpClose      Op = 8
	OpIdle       Op = 9
	// OpSize asks for the bytes the engine's data takes (kv.Sizer);
	// optional, since ABI 1.1.
	OpSize Op = 10
	// OpReclaim asks the engine to reclaim space now (kv.Reclaimer);
	// optional, since ABI 1.1.
	OpReclaim Op = 11
)

// MaxOp is the highest op code this package knows, for tables indexed by
// op.
const MaxOp = OpReclaim

// opNames are the ops' names in ABI.md, indexed by op code.
var opNames = [...]string{
	OpInit: "INIT", OpGet: "GET", OpScanOpen: "SCAN_OPEN", OpScanNext: "SCAN_NEXT",
	OpScanClose: "SCAN_CLOSE", OpCommit: "COMMIT", OpPartitions: "PARTITIONS",
	OpClose: "CLOSE", OpIdle: "IDLE", OpSize: "SIZE", OpReclaim: "RECLAIM",
}

func (o Op) String() string { return name(opNames[:], uint64(o), "OP") }

// Bit returns o's bit in Manifest.Ops.
func (o Op) Bit() uint64 { return 1 << o }

// RequiredOps are the ops every plugin must support.
const RequiredOps = 1<<OpInit | 1<<OpGet | 1<<OpScanOpen | 1<<OpScanNext | 1<<OpScanClose | 1<<OpCommit | 1<<OpClose

// Status is the first byte of every response.
type Status uint8

// Response statuses. Every status but OK, NOT_FOUND and CONFLICT carries a
// UTF-8 message as its body.
const (
	StatusOK          Status = 0
	StatusNotFound    Status = 1
	StatusConflict    Status = 2
	StatusUncertain   Status = 3
	StatusUnsupported Status = 4
	StatusInvalid     Status = 5
	StatusUnavailable Status = 6
	StatusDeadline    Status = 7
	StatusInternal    Status = 8
)

// statusNames are the statuses' names in ABI.md, indexed by status.
var statusNames = [...]string{
	StatusOK: "OK", StatusNotFound: "NOT_FOUND", StatusConflict: "CONFLICT",
	StatusUncertain: "UNCERTAIN", StatusUnsupported: "UNSUPPORTED", StatusInvalid: "INVALID",
	StatusUnavailable: "UNAVAILABLE", StatusDeadline: "DEADLINE", StatusInternal: "INTERNAL",
}

func (s Status) String() string { return name(statusNames[:], uint64(s), "STATUS") }

// Valid reports whether s is a status of this major.
func (s Status) Valid() bool { return s <= StatusInternal }

// HasMessage reports whether responses with status s carry a message body.
func (s Status) HasMessage() bool {
	return s.Valid() && s != StatusOK && s != StatusNotFound && s != StatusConflict
}

// Model is a plugin's instance model, declared in its manifest.
type Model uint8

const (
	// ModelSingle: the plugin keeps its data in its own linear memory, so
	// the host runs exactly one instance and serialises every call.
	ModelSingle Model = 1
	// ModelPooled: the plugin is a stateless client of a remote store; the
	// host runs a pool of interchangeable instances, one call in flight
	// per instance.
	ModelPooled Model = 2
)

var modelNames = [...]string{ModelSingle: "single", ModelPooled: "pooled"}

func (m Model) String() string { return name(modelNames[:], uint64(m), "model") }

// Feature bits of Manifest.Features; they mirror kv.Features.
const (
	// FeaturePartitions: PARTITIONS returns more than one range for large
	// ranges, so parallel scans pay off.
	FeaturePartitions uint64 = 1 << 0
	// FeatureDurable: an acknowledged COMMIT survives a crash of the host
	// and of the plugin.
	FeatureDurable uint64 = 1 << 1
	// FeatureNativeTTL: the engine can expire keys by itself (advisory).
	FeatureNativeTTL uint64 = 1 << 2
)

// Host flags of InitRequest.HostFlags.
const (
	// HostFlagNet: the operator allowed at least one address, so net_dial
	// may succeed.
	HostFlagNet uint64 = 1 << 0
)

// OpKind is the kind of one write in a COMMIT; the values are kv.OpKind's.
type OpKind uint8

const (
	KindPut              OpKind = 1
	KindDelete           OpKind = 2
	KindPutIfAbsent      OpKind = 3
	KindCompareAndSwap   OpKind = 4
	KindCompareAndDelete OpKind = 5
)

// kindNames are the op kinds' names in ABI.md, indexed by kind.
var kindNames = [...]string{
	KindPut: "PUT", KindDelete: "DELETE", KindPutIfAbsent: "PUT_IF_ABSENT",
	KindCompareAndSwap: "CAS", KindCompareAndDelete: "CAD",
}

func (k OpKind) String() string { return name(kindNames[:], uint64(k), "KIND") }

// name is v's entry in names, or unknown(v) for a value names does not
// name.
func name(names []string, v uint64, unknown string) string {
	if v < uint64(len(names)) && names[v] != "" {
		return names[v]
	}
	return unknown + "(" + itoa(v) + ")"
}

// HasValue reports whether ops of kind k carry a new value.
func (k OpKind) HasValue() bool {
	return k == KindPut || k == KindPutIfAbsent || k == KindCompareAndSwap
}

// HasExpected reports whether ops of kind k carry an expected value.
func (k OpKind) HasExpected() bool {
	return k == KindCompareAndSwap || k == KindCompareAndDelete
}

// PackResult packs kvp_dispatch's return value.
func PackResult(ptr, length uint32) uint64 { return uint64(ptr)<<32 | uint64(length) }

// UnpackResult splits kvp_dispatch's return value.
func UnpackResult(v uint64) (ptr, length uint32) { return uint32(v >> 32), uint32(v) }

// itoa formats v without strconv, keeping the dependency set minimal for
// the tiny String methods above.
func itoa(v uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			return string(b[i:])
		}
	}
}
