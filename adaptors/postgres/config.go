package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/engramkv/engram/sdk"
)

// Defaults of the plugin's settings.
const (
	defaultTable = "engram_kv"
	// defaultConns is each instance's connection cap: one for point reads
	// and commits, the rest for scans that span several calls, which keep
	// their snapshot transaction open on a connection of their own.
	defaultConns = 4
	maxConns     = 64
)

// config is the plugin's configuration (storage.wasm.config): settings
// separated by white space, each KEY=VALUE.
//
//	url=postgres://USER[:PASSWORD]@IP:PORT/DATABASE?sslmode=disable
//	    required; a pgx connection URL. IP:PORT must be listed in
//	    storage.wasm.allowed-addresses exactly as written here (there is
//	    no DNS inside the plugin, so use an IP address). Percent-encode
//	    special characters in the password.
//	table=NAME
//	    the table, optionally schema-qualified (default engram_kv); it is
//	    created if missing.
//	pool-size=N
//	    connections per plugin instance (default 4, 2 to 64): one for Get
//	    and Commit, the others for scans that span several calls (each
//	    holds a connection with its snapshot transaction until it ends).
//	    Engram opens storage.wasm.pool-size instances, so PostgreSQL sees
//	    up to instances x N connections.
type config struct {
	url   string
	table []string // [name] or [schema, name]
	conns int
}

// identRE is an unquoted SQL identifier. Names are restricted to it, so
// they never need case-sensitive quoting to be found by a DBA.
var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

func parseConfig(raw []byte) (config, error) {
	c := config{table: []string{defaultTable}, conns: defaultConns}
	for _, f := range strings.Fields(string(raw)) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return c, fmt.Errorf("%w: setting %q is not KEY=VALUE", sdk.ErrInvalid, f)
		}
		switch k {
		case "url":
			c.url = v
		case "table":
			parts := strings.Split(v, ".")
			if len(parts) > 2 {
				return c, fmt.Errorf("%w: table=%q: want NAME or SCHEMA.NAME", sdk.ErrInvalid, v)
			}
			for _, p := range parts {
				if !identRE.MatchString(p) {
					return c, fmt.Errorf("%w: table=%q: %q is not a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 characters)", sdk.ErrInvalid, v, p)
				}
			}
			c.table = parts
		case "pool-size":
			n, err := strconv.Atoi(v)
			if err != nil || n < 2 || n > maxConns {
				return c, fmt.Errorf("%w: pool-size=%q: want a number from 2 to %d (one connection is kept for reads and commits)", sdk.ErrInvalid, v, maxConns)
			}
			c.conns = n
		default:
			return c, fmt.Errorf("%w: unknown setting %q (known: url, table, pool-size)", sdk.ErrInvalid, k)
		}
	}
	if c.url == "" {
		return c, fmt.Errorf("%w: url=postgres://USER@IP:PORT/DATABASE is required", sdk.ErrInvalid)
	}
	return c, nil
}
