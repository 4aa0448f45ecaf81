// Package cacher runs the storage tests of k8s.io/apiserver/pkg/storage/testing
// through kube-apiserver's watch cache (k8s.io/apiserver/pkg/storage/cacher)
// on top of the etcd3 storage, against a fresh server per test. This is how a
// real kube-apiserver reads: LISTs and WATCHes are served from the cache,
// which is fed by one etcd watch with progress notifications and
// RequestWatchProgress (consistent reads from cache, WatchList).
package cacher
