package main

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"

	"github.com/go-sql-driver/mysql"

	"github.com/engramkv/engram/wasm/adaptors/internal/sqlkv"
	"github.com/engramkv/engram/wasm/sdk"
)

// discardLogger silences the driver's log: what it logs (I/O errors) also
// comes back as the error the plugin classifies and reports.
type discardLogger struct{}

func (discardLogger) Print(...any) {}

// trackedConn is a host socket that remembers its first I/O error.
type trackedConn struct {
	net.Conn
	err error
}

func (t *trackedConn) Read(p []byte) (int, error) {
	n, err := t.Conn.Read(p)
	if err != nil && t.err == nil {
		t.err = err
	}
	return n, err
}

func (t *trackedConn) Write(p []byte) (int, error) {
	n, err := t.Conn.Write(p)
	if err != nil && t.err == nil {
		t.err = err
	}
	return n, err
}

// conn is one server connection.
type conn struct {
	dc interface {
		driver.Conn
		driver.ExecerContext
		driver.QueryerContext
	}
	nc   *trackedConn
	inTx bool // a transaction may be open: the connection needs ROLLBACK or COMMIT
	bad  bool // an I/O or protocol error: the connection is unusable
}

// Reusable: a connection that is broken or still inside a transaction (an
// error left it there) is closed instead of pooled.
func (c *conn) Reusable() bool { return !c.bad && !c.inTx }

// Close sends COM_QUIT on a connection that is still open, and the server
// rolls back what it held.
func (c *conn) Close() { _ = c.dc.Close() }

// Stale: a pooled connection that died while idle gets no answer to the
// call's first statement, or the answer the server leaves before closing
// an idle connection (MySQL's 4031 after wait_timeout, MariaDB's 1927
// after KILL).
func (d *adaptor) Stale(c *conn, err error) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number == 4031 || me.Number == 1927
	}
	return c.bad
}

var errNoRows = errors.New("no rows")

// exec runs statements (one or several, separated by semicolons) and
// returns the rows each affected.
func (c *conn) exec(sql string) error {
	_, err := c.execCounts(sql)
	return err
}

func (c *conn) execCounts(sql string) ([]int64, error) {
	res, err := c.dc.ExecContext(context.Background(), sql, nil)
	if err != nil {
		return nil, c.failed(err)
	}
	return res.(mysql.Result).AllRowsAffected(), nil
}

// query runs sql and returns its rows; the caller closes them.
func (c *conn) query(sql string) (driver.Rows, error) {
	rows, err := c.dc.QueryContext(context.Background(), sql, nil)
	if err != nil {
		return nil, c.failed(err)
	}
	return rows, nil
}

// queryTwo returns the first row's first two columns, or errNoRows.
func (c *conn) queryTwo(sql string) ([]byte, []byte, error) {
	rows, err := c.query(sql)
	if err != nil {
		return nil, nil, err
	}
	dest := make([]driver.Value, len(rows.Columns()))
	err = rows.Next(dest)
	var a, b []byte
	if err == nil {
		a = cloneValue(dest, 0)
		b = cloneValue(dest, 1)
	}
	if cerr := rows.Close(); cerr != nil && (err == nil || err == io.EOF) {
		err = cerr
	}
	if err == io.EOF {
		return nil, nil, errNoRows
	}
	if err != nil {
		return nil, nil, c.failed(err)
	}
	return a, b, nil
}

// queryAll returns every row of a small result.
func (c *conn) queryAll(sql string) ([][][]byte, error) {
	rows, err := c.query(sql)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	dest := make([]driver.Value, len(rows.Columns()))
	var out [][][]byte
	for {
		if err := rows.Next(dest); err == io.EOF {
			break
		} else if err != nil {
			return nil, c.failed(err)
		}
		r := make([][]byte, len(dest))
		for i := range dest {
			r[i] = cloneValue(dest, i)
		}
		out = append(out, r)
	}
	return out, nil
}

// cloneValue copies column i of a text-protocol row: []byte aliasing the
// driver's buffer for strings, int64 for integer columns (the driver
// parses those), nil for NULL and for a missing column. An empty string
// is empty, not nil.
func cloneValue(dest []driver.Value, i int) []byte {
	if i >= len(dest) {
		return nil
	}
	switch v := dest[i].(type) {
	case []byte:
		return append(make([]byte, 0, len(v)), v...)
	case int64:
		return strconv.AppendInt(nil, v, 10)
	case uint64:
		return strconv.AppendUint(nil, v, 10)
	case nil:
		return nil
	default:
		return fmt.Append(nil, v)
	}
}

// failed notes an error of a statement on c: one that is not the
// server's answer leaves the connection unusable, and the driver reports
// it as "invalid connection", so the socket's own error (a timeout, a
// reset) is added for classify and the message.
func (c *conn) failed(err error) error {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return err
	}
	c.bad = true
	if c.nc != nil && c.nc.err != nil && !errors.Is(err, c.nc.err) {
		return fmt.Errorf("%w (%w)", err, c.nc.err)
	}
	return err
}

// rollback ends a transaction that failed before COMMIT, so the
// connection can be reused; the pool discards it if that fails.
func (c *conn) rollback() {
	if c.bad || !c.inTx {
		return
	}
	if err := c.exec("ROLLBACK"); err != nil {
		c.bad = true
		return
	}
	c.inTx = false
}

// connect opens a new connection through connector, whose dial function
// records the socket it dials in *dialled.
func connect(ctx context.Context, connector driver.Connector, dialled **trackedConn) (*conn, error) {
	*dialled = nil
	dc, err := connector.Connect(ctx)
	nc := *dialled
	*dialled = nil
	if err != nil {
		if nc != nil && nc.err != nil {
			err = fmt.Errorf("%w (%w)", err, nc.err)
		}
		return nil, err
	}
	c := &conn{nc: nc}
	var ok bool
	if c.dc, ok = dc.(interface {
		driver.Conn
		driver.ExecerContext
		driver.QueryerContext
	}); !ok {
		_ = dc.Close()
		return nil, fmt.Errorf("the driver's connection %T cannot run statements directly", dc)
	}
	return c, nil
}

// Server error numbers the plugin handles specially.
const (
	erLockWaitTimeout = 1205
	erLockDeadlock    = 1213
	// erWsrepNotReady is Galera's answer (ER_UNKNOWN_COM_ERROR, SQLSTATE
	// 08S01: "WSREP has not yet prepared node for application use") on a
	// node outside the primary component (quorum lost, still joining) or
	// refusing clients (wsrep_reject_queries).
	erWsrepNotReady = 1047
	// erUnknownSystemVariable answers a query of @@wsrep_on on a server
	// built without Galera (MySQL).
	erUnknownSystemVariable = 1193
)

// Retryable reports whether err is a transaction the server aborted (a
// deadlock rolls back the whole transaction; a lock wait timeout the
// statement, and Commit rolls back the rest) so that running it again may
// succeed.
func (d *adaptor) Retryable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == erLockDeadlock || me.Number == erLockWaitTimeout)
}

// classify wraps a driver error with the SDK error that selects its
// status; err stays in the chain for the message. It is for errors whose
// outcome is known not to have changed anything (reads, and writes before
// COMMIT was sent). Errors of a connection carry its socket's error
// (conn.failed), which tells a timeout from a lost connection.
//
//   - timeouts (the host's deadline on the socket, max_statement_time,
//     max_execution_time) are DEADLINE;
//   - a lost or refused connection, the server shutting down, too many
//     connections, a Galera node that is not ready, and deadlocks and lock
//     wait timeouts that outlived the retries are UNAVAILABLE: a retry
//     (perhaps on another node) may succeed;
//   - everything else (SQL errors, permissions, a dropped table) is
//     INTERNAL.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case 1969, // MariaDB: max_statement_time exceeded
			3024: // MySQL: max_execution_time exceeded
			return fmt.Errorf("%w: %w", sdk.ErrDeadline, err)
		case erLockDeadlock, erLockWaitTimeout,
			1040,       // too many connections
			1203, 1226, // the user's connection or resource limits
			1053, 1077, 1078, // server shutdown in progress, shutdown
			erWsrepNotReady,
			1927,       // MariaDB: connection killed
			3032, 4031: // MySQL: offline mode; idle client disconnected
			return fmt.Errorf("%w: %w", sdk.ErrUnavailable, err)
		}
		return err
	}
	if errors.Is(err, mysql.ErrPktTooLarge) {
		return err // the statement is at fault, not the connection: INTERNAL
	}
	return sqlkv.ClassifyTransport(err, false)
}

// Classify is classify, for sqlkv.
func (d *adaptor) Classify(err error) error { return classify(err) }
