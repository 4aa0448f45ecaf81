package config

import (
	"fmt"
	"net/url"
	"strings"
)

// ClientURL is a parsed listen or advertise URL.
type ClientURL struct {
	// Scheme is "http", "https" or "unix".
	Scheme string
	// Address is host:port for http and https, the socket path for unix.
	Address string
}

// ParseClientURL parses an entry of listen-client-urls or
// advertise-client-urls. Unix socket URLs follow the etcd client's reading:
// unix:///abs/path and unix:/abs/path are absolute, unix://rel/path and
// unix:rel/path relative to the working directory.
func ParseClientURL(raw string) (ClientURL, error) {
	if rest, ok := strings.CutPrefix(raw, "unix:"); ok {
		path := strings.TrimPrefix(rest, "//")
		if path == "" {
			return ClientURL{}, fmt.Errorf("%q: unix socket URL has no path (want unix:///abs/path or unix:rel/path)", raw)
		}
		return ClientURL{Scheme: "unix", Address: path}, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return ClientURL{}, fmt.Errorf("%q: %w", raw, err)
	}
	switch u.Scheme {
	case "http", "https":
	default:
		return ClientURL{}, fmt.Errorf("%q: unsupported scheme %q (want http, https or unix)", raw, u.Scheme)
	}
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return ClientURL{}, fmt.Errorf("%q: a client URL is scheme://host:port with nothing after the port", raw)
	}
	if err := checkHostPort(u.Host); err != nil {
		return ClientURL{}, fmt.Errorf("%q: %w", raw, err)
	}
	return ClientURL{Scheme: u.Scheme, Address: u.Host}, nil
}
