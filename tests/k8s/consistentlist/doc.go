// Package consistentlist measures what a consistent list served from
// kube-apiserver's watch cache costs on the server under it.
//
// kube-apiserver 1.37 serves a LIST without a resourceVersion from its watch
// cache (ConsistentListFromCache): it reads the store's current revision (a
// Get of the resource's prefix key, GetCurrentResourceVersion), then waits
// until the cache's watch has reached that revision, through an event of the
// resource or a progress notification it asks for with RequestProgress every
// 100 ms while someone waits (k8s.io/apiserver/pkg/storage/cacher/progress).
// In a live cluster most writes are to other resources (leases, nodes,
// events), so that wait is usually a progress round trip on the watch stream
// all the caches share. The benchmark builds that: several caches over one
// client (so one watch stream), 5,000 pods, writes flowing to another
// resource, and times full paginated consistent lists of the pods.
package consistentlist
