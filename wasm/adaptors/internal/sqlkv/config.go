package sqlkv

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/engramkv/engram/wasm/sdk"
)

// Defaults of the common settings.
const (
	DefaultTable = "engram_kv"
	// DefaultConns is each instance's connection cap: one for point reads
	// and commits, the rest for scans that span several calls, which keep
	// their snapshot transaction open on a connection of their own.
	DefaultConns = 4
	MaxConns     = 64
)

// Config holds the settings every SQL adaptor takes:
//
//	table=NAME or QUALIFIER.NAME
//	    the table (default engram_kv); it is created if missing.
//	pool-size=N
//	    connections per plugin instance (default 4, 2 to 64): one for Get
//	    and Commit, the others for scans that span several calls (each
//	    holds a connection with its snapshot transaction until it ends).
//	    Engram opens storage.wasm.pool-size instances, so the server sees
//	    up to instances x N connections.
type Config struct {
	Table []string // [name] or [qualifier, name]
	Conns int
}

// Setting is one of an adaptor's own settings; Set checks and keeps value.
type Setting struct {
	Key string
	Set func(value string) error
}

// Dialect is what the common settings' checks depend on.
type Dialect struct {
	// MaxIdent is the server's longest identifier, in bytes.
	MaxIdent int
	// Qualifier names the first part of table=A.B: SCHEMA, DATABASE.
	Qualifier string
}

// ParseConfig parses raw, white-space separated KEY=VALUE settings: the
// common ones into the result, the adaptor's own through own. An adaptor
// checks its required settings afterwards.
func ParseConfig(raw []byte, d Dialect, own ...Setting) (Config, error) {
	c := Config{Table: []string{DefaultTable}, Conns: DefaultConns}
	// Names are restricted to unquoted identifiers, so they never need
	// quoting to be found by a DBA, and cannot smuggle SQL into the
	// statements that embed them.
	ident := regexp.MustCompile(fmt.Sprintf(`^[A-Za-z_][A-Za-z0-9_]{0,%d}$`, d.MaxIdent-1))
	for _, f := range strings.Fields(string(raw)) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return c, fmt.Errorf("%w: setting %q is not KEY=VALUE", sdk.ErrInvalid, f)
		}
		switch k {
		case "table":
			parts := strings.Split(v, ".")
			if len(parts) > 2 {
				return c, fmt.Errorf("%w: table=%q: want NAME or %s.NAME", sdk.ErrInvalid, v, d.Qualifier)
			}
			for _, p := range parts {
				if !ident.MatchString(p) {
					return c, fmt.Errorf("%w: table=%q: %q is not a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*, at most %d characters)", sdk.ErrInvalid, v, p, d.MaxIdent)
				}
			}
			c.Table = parts
		case "pool-size":
			n, err := strconv.Atoi(v)
			if err != nil || n < 2 || n > MaxConns {
				return c, fmt.Errorf("%w: pool-size=%q: want a number from 2 to %d (one connection is kept for reads and commits)", sdk.ErrInvalid, v, MaxConns)
			}
			c.Conns = n
		default:
			i := slices.IndexFunc(own, func(s Setting) bool { return s.Key == k })
			if i < 0 {
				known := []string{}
				for _, s := range own {
					known = append(known, s.Key)
				}
				known = append(known, "table", "pool-size")
				return c, fmt.Errorf("%w: unknown setting %q (known: %s)", sdk.ErrInvalid, k, strings.Join(known, ", "))
			}
			if err := own[i].Set(v); err != nil {
				return c, fmt.Errorf("%w: %s: %v", sdk.ErrInvalid, k, err)
			}
		}
	}
	return c, nil
}
