package host

import (
	"strconv"
	"strings"
	"testing"

	"github.com/engramkv/engram/internal/mysqltest"
	"github.com/engramkv/engram/internal/pgtest"
)

// postgresSpace runs the space round (spaceRound) on postgres.wasm: the
// quota is measured with pg_total_relation_size, and defrag must VACUUM
// the store's table, which PostgreSQL counts in pg_stat_user_tables.
func postgresSpace(t *testing.T, pg *pgtest.Server) {
	s, table := postgresEnv.openTable(t, "", StoreOptions{})
	vacuums := func() int64 {
		t.Helper()
		out, err := pg.Exec("", "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = '"+table+"'")
		n, perr := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
		if err != nil || perr != nil {
			t.Fatalf("reading the vacuum count of %s: %q, %v", table, out, err)
		}
		return n
	}
	spaceRound(t, s, 1<<20, vacuums)
}

// mysqlSpace runs the space round on mysql.wasm: defrag must run OPTIMIZE
// TABLE, which the server counts in Com_optimize. The quota is small since
// InnoDB's statistics lag the writes: what refuses the writes is mostly the
// quota's own count of what it admitted since it last measured.
func mysqlSpace(t *testing.T, my *mysqltest.Server) {
	s := mysqlEnv.open(t, "", StoreOptions{})
	optimizes := func() int64 {
		t.Helper()
		out, err := my.Exec("", "SHOW GLOBAL STATUS LIKE 'Com_optimize'")
		n, perr := strconv.ParseInt(strings.TrimPrefix(strings.TrimSpace(out), "Com_optimize\t"), 10, 64)
		if err != nil || perr != nil {
			t.Fatalf("reading Com_optimize: %q, %v", out, err)
		}
		return n
	}
	spaceRound(t, s, 256<<10, optimizes)
}
