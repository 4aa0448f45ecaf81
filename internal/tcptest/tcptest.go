// Package tcptest is the listener and accept loop of the tests' TCP
// proxies (internal/stallproxy, the SQL adaptors' cut proxy): a port on
// 127.0.0.1 chosen at run time, a goroutine per accepted connection, and a
// cleanup that stops them all when the test ends.
//
// It owns only the listener and the goroutines it starts; what happens to
// a connection is the caller's. It must not sleep or read the wall clock.
package tcptest

import (
	"net"
	"sync"
	"testing"
)

// Serve listens on 127.0.0.1 and hands each connection it accepts to
// serve, in a goroutine of its own, until t ends; serve counts any
// goroutine it starts in wg. At cleanup Serve closes the listener, runs
// stop (nil for nothing; it must make every serve return, by closing
// their connections) and waits for every goroutine. It returns the
// listener's "127.0.0.1:PORT".
func Serve(t testing.TB, serve func(c net.Conn, wg *sync.WaitGroup), stop func()) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		if stop != nil {
			stop()
		}
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				serve(c, &wg)
			}()
		}
	}()
	return ln.Addr().String()
}
