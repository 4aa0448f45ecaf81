package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/engramkv/engram/cmd/engram/internal/config"
)

// clientListener is a bound socket of one listen-client-urls entry.
type clientListener struct {
	net.Listener
	url    string           // as configured
	parsed config.ClientURL // scheme and address
}

// secure reports whether the listener is served with TLS.
func (l clientListener) secure() bool { return l.parsed.Scheme == "https" }

// listenClientURLs binds every URL, closing the ones already bound if a later
// one fails, so a bad configuration leaves nothing open.
func listenClientURLs(ctx context.Context, urls []string) ([]clientListener, error) {
	var out []clientListener
	for _, raw := range urls {
		u, err := config.ParseClientURL(raw)
		if err != nil {
			closeListeners(out)
			return nil, fmt.Errorf("listen-client-urls: %w", err)
		}
		var l net.Listener
		if u.Scheme == "unix" {
			l, err = listenUnix(ctx, u.Address)
		} else {
			var lc net.ListenConfig
			l, err = lc.Listen(ctx, "tcp", u.Address)
		}
		if err != nil {
			closeListeners(out)
			return nil, fmt.Errorf("listen-client-urls: listen on %s: %w", raw, err)
		}
		out = append(out, clientListener{Listener: l, url: raw, parsed: u})
	}
	return out, nil
}

func closeListeners(ls []clientListener) {
	for _, l := range ls {
		_ = l.Close()
	}
}

// listenUnix binds a unix socket. A socket file left behind by a process
// that was killed (so never unlinked it) is removed, but only after a dial
// proves nobody is serving on it: a live server's socket is never stolen.
func listenUnix(ctx context.Context, path string) (net.Listener, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "unix", path)
	if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
		return l, err
	}
	fi, statErr := os.Lstat(path)
	if statErr != nil || fi.Mode()&os.ModeSocket == 0 {
		return nil, err
	}
	d := net.Dialer{Timeout: time.Second}
	c, dialErr := d.DialContext(ctx, "unix", path)
	if dialErr == nil {
		_ = c.Close()
		return nil, fmt.Errorf("%w (another process is serving on it)", err)
	}
	if !errors.Is(dialErr, syscall.ECONNREFUSED) {
		return nil, err
	}
	if rmErr := os.Remove(path); rmErr != nil {
		return nil, fmt.Errorf("remove stale socket: %w", rmErr)
	}
	return lc.Listen(ctx, "unix", path)
}
