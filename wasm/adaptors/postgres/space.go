package main

import (
	"context"
	"fmt"
	"time"

	"github.com/engramkv/engram/wasm/adaptors/internal/sqlkv"
)

// Size is the table's size on disk with its TOAST table and indexes
// (pg_total_relation_size): what Engram's data takes in the database, the
// figure etcd's DbSize, the db size metric and quota-backend-bytes see. It
// is read from the files' sizes, so it follows writes at once; space that
// deletes freed counts until VACUUM makes it reusable, and the files only
// shrink when empty pages sit at the table's end.
func (s *store) Size(ctx context.Context) (int64, error) {
	return sqlkv.Query(ctx, s.pool, s.drv, "size", func(c *conn) (int64, error) {
		var n int64
		err := c.QueryRow(context.Background(), s.drv.sql.size, s.table).Scan(&n)
		return n, err
	})
}

// Reclaim runs a plain VACUUM of the table (etcd's Defragment): dead rows'
// space becomes reusable, and trailing empty pages go back to the file
// system. It is not VACUUM FULL, which would hold every commit for the
// whole rewrite (see statements.vacuum; DESIGN.md, "Size and reclamation
// through the plugin ABI"). VACUUM cannot run in a
// transaction, so it goes alone on an idle connection through the simple
// protocol; the request's deadline becomes its statement_timeout, so that
// a VACUUM cut off by the deadline stops in the server too instead of
// running on behind a closed socket.
func (s *store) Reclaim(ctx context.Context) error {
	return sqlkv.Do(ctx, s.pool, s.drv, "reclaim: VACUUM "+s.table, func(c *conn) error {
		if dl, ok := ctx.Deadline(); ok {
			ms := time.Until(dl).Milliseconds()
			if ms <= 0 {
				return context.DeadlineExceeded
			}
			if _, err := simpleExec(c, fmt.Sprintf(`SET statement_timeout = %d`, ms)); err != nil {
				return err
			}
			defer func() { _, _ = simpleExec(c, `RESET statement_timeout`) }()
		}
		_, err := simpleExec(c, s.drv.sql.vacuum)
		return err
	})
}
