package host

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestMetricsSharedOnOneRegistry: a second plugin on the same registry
// uses the collectors the first registered, which are labelled by plugin,
// instead of failing to register its own.
func TestMetricsSharedOnOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, b := newMetrics(reg), newMetrics(reg)
	if a.calls != b.calls || a.errors != b.errors || a.latency != b.latency || a.traps != b.traps ||
		a.replacements != b.replacements || a.instances != b.instances || a.memory != b.memory {
		t.Fatal("the second plugin's metrics are not the collectors the first registered")
	}
	b.calls.WithLabelValues("two", "GET").Inc()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "engram_wasm_calls_total" {
			return
		}
	}
	t.Fatal("the shared calls counter is not gathered")
}
