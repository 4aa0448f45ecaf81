package server

import "github.com/prometheus/client_golang/prometheus"

// quotaGauge is etcd's etcd_server_quota_backend_bytes: the configured
// quota, which the etcd mixin's low-space alert divides the database size
// by. Only a server that enforces a quota exports it (etcd always has one,
// 2 GiB by default; Engram has none unless configured).
func quotaGauge(bytes int64) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "etcd", Subsystem: "server", Name: "quota_backend_bytes",
		Help: "Current backend storage quota size in bytes."})
	g.Set(float64(bytes))
	return g
}
