package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/go-sql-driver/mysql"

	"github.com/engramkv/engram/wasm/adaptors/internal/sqlkv"
	"github.com/engramkv/engram/wasm/sdk"
)

// Size is the table's DATA_LENGTH + INDEX_LENGTH from
// information_schema.TABLES: the pages InnoDB has allocated to the
// clustered index (the rows, and the values stored off-page) and to the
// secondary indexes (none here), in bytes. It is what etcd's DbSize, the db
// size metric and quota-backend-bytes see.
//
// The figure comes from InnoDB's table statistics, not from the file: it
// moves when they are recomputed (in the background once about a tenth of
// the rows changed, at ANALYZE TABLE and OPTIMIZE TABLE, and on MySQL 8 it
// is also cached for information_schema_stats_expiry, a day by default), so
// it lags writes and can stay at its starting 16 KiB for a small table.
// It never counts the file's free space, so it shrinks after deletes only
// once statistics catch up. A quota on it is approximate.
func (s *store) Size(ctx context.Context) (int64, error) {
	return sqlkv.Query(ctx, s.pool, s.drv, "size", func(c *conn) (int64, error) {
		v, _, err := c.queryTwo(s.drv.sql.size())
		if errors.Is(err, errNoRows) {
			return 0, fmt.Errorf("table %s is not in information_schema.TABLES", s.drv.sql.table)
		}
		if err != nil {
			return 0, err
		}
		return strconv.ParseInt(string(v), 10, 64)
	})
}

// Reclaim is OPTIMIZE TABLE (etcd's Defragment). InnoDB runs it as an
// online rebuild (ALTER TABLE ... FORCE, ALGORITHM=INPLACE): reads and
// commits go on while the table is copied and are blocked only for the
// short metadata locks at its start and end; the rebuilt file holds no
// free pages, and the statistics are recomputed, so Size catches up.
//
// On a Galera node it does nothing and says so: OPTIMIZE TABLE is
// replicated in Total Order Isolation (wsrep_OSU_method=TOI), so every node
// runs the rebuild at the same point of the replication order, and commits
// wait until it ends, even to other tables on other nodes (measured: a
// one-row INSERT waited the whole 3.7 s rebuild); that holds Engram's
// commits for the whole rebuild, which kv.Reclaimer forbids. InnoDB reuses
// the pages deletes free on its own; an operator who wants the files to
// shrink runs the statement in a maintenance window (or node by node with
// wsrep_OSU_method=RSU). DESIGN.md, "Size and reclamation through the
// plugin ABI".
func (s *store) Reclaim(ctx context.Context) error {
	return sqlkv.Do(ctx, s.pool, s.drv, "reclaim", func(c *conn) error {
		on, _, err := c.queryTwo(`SELECT @@wsrep_on, NULL`)
		var me *mysql.MySQLError
		switch {
		case errors.As(err, &me) && me.Number == erUnknownSystemVariable:
			// A server without Galera (MySQL).
		case err != nil:
			return err
		case string(on) == "1":
			sdk.Logger().Warn("defragment: not running OPTIMIZE TABLE on a Galera node: it replicates in total order and would block the cluster's writes to the table while it rebuilds; InnoDB reuses freed pages by itself",
				"table", s.drv.sql.table)
			return nil
		}
		rows, err := c.queryAll(s.drv.sql.optimize())
		if err != nil {
			return err
		}
		// Table, Op, Msg_type, Msg_text: an error is reported as a row.
		for _, r := range rows {
			if len(r) == 4 && string(r[2]) == "error" {
				return fmt.Errorf("OPTIMIZE TABLE: %s", r[3])
			}
		}
		return nil
	})
}
