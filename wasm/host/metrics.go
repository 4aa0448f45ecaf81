package host

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/engramkv/engram/wasm/abi"
)

// metrics are a plugin's Prometheus collectors, labelled by the plugin's
// manifest name. They are created once per Plugin and shared by its stores.
type metrics struct {
	calls        *prometheus.CounterVec
	errors       *prometheus.CounterVec
	latency      *prometheus.HistogramVec
	traps        *prometheus.CounterVec
	replacements *prometheus.CounterVec
	instances    *prometheus.GaugeVec
	memory       *prometheus.GaugeVec
}

// register registers *c with reg. When another plugin on the same registry
// registered it first, *c becomes that collector: plugins share the
// collectors, which are labelled by plugin.
func register[C prometheus.Collector](reg prometheus.Registerer, c *C) {
	var are prometheus.AlreadyRegisteredError
	if err := reg.Register(*c); errors.As(err, &are) {
		*c = are.ExistingCollector.(C)
	}
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "engram_wasm_calls_total", Help: "Calls into wasm plugin instances, by op.",
		}, []string{"plugin", "op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "engram_wasm_call_errors_total",
			Help: "Failed wasm plugin calls, by op and kind (status: the plugin answered an error status; trap, deadline, protocol: the instance was discarded; refused: the host did not send it).",
		}, []string{"plugin", "op", "kind"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "engram_wasm_call_duration_seconds",
			Help:    "Duration of wasm plugin calls, by op, including waiting for a free instance.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12),
		}, []string{"plugin", "op"}),
		traps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "engram_wasm_instance_failures_total",
			Help: "Wasm plugin instances discarded after a trap, a deadline overrun or an ABI violation.",
		}, []string{"plugin"}),
		replacements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "engram_wasm_instance_replacements_total", Help: "Wasm plugin instances started to replace discarded ones.",
		}, []string{"plugin"}),
		instances: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "engram_wasm_instances", Help: "Live wasm plugin instances.",
		}, []string{"plugin"}),
		memory: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "engram_wasm_memory_bytes", Help: "Linear memory of live wasm plugin instances, summed.",
		}, []string{"plugin"}),
	}
	if reg != nil {
		register(reg, &m.calls)
		register(reg, &m.errors)
		register(reg, &m.latency)
		register(reg, &m.traps)
		register(reg, &m.replacements)
		register(reg, &m.instances)
		register(reg, &m.memory)
	}
	return m
}

// opMetrics are one store's pre-resolved children for one op, so a call
// pays no label lookup.
type opMetrics struct {
	calls   prometheus.Counter
	latency prometheus.Observer
}

// storeMetrics are a store's resolved children.
type storeMetrics struct {
	m            *metrics
	plugin       string
	ops          [abi.MaxOp + 1]opMetrics
	traps        prometheus.Counter
	replacements prometheus.Counter
	instances    prometheus.Gauge
	memory       prometheus.Gauge
}

func (m *metrics) forStore(plugin string) *storeMetrics {
	sm := &storeMetrics{
		m:            m,
		plugin:       plugin,
		traps:        m.traps.WithLabelValues(plugin),
		replacements: m.replacements.WithLabelValues(plugin),
		instances:    m.instances.WithLabelValues(plugin),
		memory:       m.memory.WithLabelValues(plugin),
	}
	for op := abi.OpInit; op <= abi.MaxOp; op++ {
		sm.ops[op] = opMetrics{
			calls:   m.calls.WithLabelValues(plugin, op.String()),
			latency: m.latency.WithLabelValues(plugin, op.String()),
		}
	}
	return sm
}

func (sm *storeMetrics) failed(op abi.Op, kind errorKind) {
	sm.m.errors.WithLabelValues(sm.plugin, op.String(), kind.String()).Inc()
}
