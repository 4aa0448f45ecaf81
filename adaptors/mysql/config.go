package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"

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
//	dsn=USER[:PASSWORD]@tcp(IP:PORT)/DATABASE[?PARAM=VALUE&...]
//	    required; a go-sql-driver/mysql DSN. IP:PORT must be listed in
//	    storage.wasm.allowed-addresses exactly as written here (there is
//	    no DNS inside the plugin, so use an IP address). Unknown params
//	    are session variables set on every connection.
//	table=NAME or DATABASE.NAME
//	    the table (default engram_kv in the DSN's database); it is
//	    created if missing.
//	pool-size=N
//	    connections per plugin instance (default 4, 2 to 64): one for Get
//	    and Commit, the others for scans that span several calls (each
//	    holds a connection with its snapshot transaction until it ends).
//	    Engram opens storage.wasm.pool-size instances, so the server sees
//	    up to instances x N connections.
type config struct {
	dsn   *mysql.Config
	table []string // [name] or [database, name]
	conns int
}

// identRE is an unquoted SQL identifier. Names are restricted to it, so
// they never need quoting to be found by a DBA, and so that a name cannot
// smuggle SQL into the statements that embed it.
var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

func parseConfig(raw []byte) (config, error) {
	c := config{table: []string{defaultTable}, conns: defaultConns}
	for _, f := range strings.Fields(string(raw)) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return c, fmt.Errorf("%w: setting %q is not KEY=VALUE", sdk.ErrInvalid, f)
		}
		switch k {
		case "dsn":
			d, err := mysql.ParseDSN(v)
			if err != nil {
				return c, fmt.Errorf("%w: dsn: %v", sdk.ErrInvalid, err)
			}
			if d.Net != "tcp" {
				return c, fmt.Errorf("%w: dsn: network %q: only tcp(IP:PORT) reaches a server from inside the plugin", sdk.ErrInvalid, d.Net)
			}
			if d.DBName == "" {
				return c, fmt.Errorf("%w: dsn: no database: want USER@tcp(IP:PORT)/DATABASE", sdk.ErrInvalid)
			}
			c.dsn = d
		case "table":
			parts := strings.Split(v, ".")
			if len(parts) > 2 {
				return c, fmt.Errorf("%w: table=%q: want NAME or DATABASE.NAME", sdk.ErrInvalid, v)
			}
			for _, p := range parts {
				if !identRE.MatchString(p) {
					return c, fmt.Errorf("%w: table=%q: %q is not a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*, at most 64 characters)", sdk.ErrInvalid, v, p)
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
			return c, fmt.Errorf("%w: unknown setting %q (known: dsn, table, pool-size)", sdk.ErrInvalid, k)
		}
	}
	if c.dsn == nil {
		return c, fmt.Errorf("%w: dsn=USER:PASSWORD@tcp(IP:PORT)/DATABASE is required", sdk.ErrInvalid)
	}
	return c, nil
}

// quotedTable is the table's name as SQL: each part in backquotes
// (identRE admits no backquote).
func (c config) quotedTable() string {
	q := make([]string, len(c.table))
	for i, p := range c.table {
		q[i] = "`" + p + "`"
	}
	return strings.Join(q, ".")
}
