package etcdmetrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/engramkv/engram/core/kv"
)

// TimedStore returns st timing its commits for
// etcd_disk_backend_commit_duration_seconds; give it to the leader's MVCC
// backend alone.
func (m *Metrics) TimedStore(st kv.Store) kv.Store {
	return timedStore{Store: st, seconds: m.commitSeconds}
}

// timedStore times the leader's commits into the storage engine for
// etcd_disk_backend_commit_duration_seconds: each is what etcd's backend
// commit is, the point a group of writes becomes durable. Only the MVCC
// backend uses it; it passes the rest through.
type timedStore struct {
	kv.Store
	seconds prometheus.Observer
}

func (t timedStore) Commit(ctx context.Context, ops []kv.Op) error {
	start := time.Now()
	err := t.Store.Commit(ctx, ops)
	t.seconds.Observe(time.Since(start).Seconds())
	return err
}

// dbSizeCollector reports the engine's size where the adaptor knows it,
// and nothing at a scrape where it cannot tell (rather than a false 0).
// Engram has no free pages to tell apart, so "in use" is the same size, as
// Status reports DbSizeInUse.
type dbSizeCollector struct{ size kv.Sizer }

var (
	dbTotalDesc = prometheus.NewDesc("etcd_mvcc_db_total_size_in_bytes",
		"Total size of the underlying database physically allocated in bytes.", nil, nil)
	dbInUseDesc = prometheus.NewDesc("etcd_mvcc_db_total_size_in_use_in_bytes",
		"Total size of the underlying database logically in use in bytes.", nil, nil)
)

func (c *dbSizeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- dbTotalDesc; ch <- dbInUseDesc }
func (c *dbSizeCollector) Collect(ch chan<- prometheus.Metric) {
	n, err := c.size.Size()
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(dbTotalDesc, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(dbInUseDesc, prometheus.GaugeValue, float64(n))
}

// quotaGauge is etcd's etcd_server_quota_backend_bytes: the configured
// quota, which the etcd mixin's low-space alert divides the database size
// by. Only a server that enforces a quota exports it (etcd always has one,
// 2 GiB by default; Engram has none unless configured).
func quotaGauge(bytes int64) prometheus.Collector {
	g := gauge("etcd_server_quota_backend_bytes", "Current backend storage quota size in bytes.")
	g.Set(float64(bytes))
	return g
}
