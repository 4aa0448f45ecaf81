// Package etcd3 runs the store and watcher tests of
// k8s.io/apiserver/pkg/storage/testing through kube-apiserver's etcd3
// storage (k8s.io/apiserver/pkg/storage/etcd3) against a fresh server per
// test. The server is Engram, or real etcd with -tags etcdref (see
// internal/backend).
package etcd3
