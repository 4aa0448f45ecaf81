//go:build !linux

package etcdtest

import "syscall"

// procAttr: outside Linux there is no parent-death signal; etcd is stopped
// by the test's cleanup only.
func procAttr() *syscall.SysProcAttr {
	return nil
}
