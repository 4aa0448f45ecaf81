package etcdtest

import "syscall"

// procAttr makes the kernel kill etcd when the test process dies, so a
// test binary killed by a timeout or a signal leaves no etcd listening.
// Pdeathsig fires when the thread that started the child exits; Go keeps
// its threads unless a goroutine exits while locked to one
// (runtime.LockOSThread), which nothing in this repository does. Were it
// to happen, etcd would die early and the test fail loudly, not leak it.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
