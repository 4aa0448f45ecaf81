// Command postgres is an Engram storage plugin that keeps Engram's internal
// keys in one PostgreSQL table, one row per key holding the key and its
// value (the layout of KubeBrain's SQL mapping), through pgx running inside
// the plugin over the host's sockets.
//
// It owns the mapping of the adaptor contract onto SQL: Get is a primary-key
// SELECT; a Scan is a snapshot (one REPEATABLE READ READ ONLY transaction
// per scan that spans several batches) read in ordered, LIMITed keyset
// pages; a Commit is one READ COMMITTED transaction in which conditions are
// checked by the writes themselves (INSERT ... ON CONFLICT DO NOTHING,
// UPDATE/DELETE ... AND value = expected) and a failed one rolls everything
// back; SIZE is pg_total_relation_size of the table and RECLAIM a plain
// VACUUM, never VACUUM FULL (space.go). It must not keep any state but connections between calls (the
// instance model is pooled: instances are interchangeable and may be
// replaced at any time), must not start goroutines that need to run
// between calls, and must not resolve names (there is no DNS inside wasm).
//
// What does not depend on the driver (the common settings, the connection
// pool, the commit loop, the scan iterator) is wasm/adaptors/internal/sqlkv's;
// this package keeps the SQL, the driver calls and what PostgreSQL's errors
// mean.
//
// Configuration and schema: see config and schema. Build:
//
//	make build  # bin/postgres.wasm; by hand, from wasm/adaptors/:
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o ../bin/postgres.wasm ./postgres
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/engramkv/engram/wasm/adaptors/internal/sqlkv"
	"github.com/engramkv/engram/wasm/sdk"
)

func main() { sqlkv.Serve(&store{}) }

// minServerVersion is PostgreSQL 12: stored generated columns.
const minServerVersion = 120000

// store is one instance's state: the configuration and its connections.
type store struct {
	cfg       config
	table     string
	drv       *adaptor
	pool      *sqlkv.Pool[*conn]
	pageBytes int // sqlkv.PageBytes
}

// adaptor is the plugin's side of sqlkv's shared logic.
type adaptor struct {
	sql *statements
}

// conn is one server connection. Statements run under
// context.Background(): a deadline inside the guest cannot interrupt a
// blocked host read anyway (the host applies the call's deadline to the
// socket), and a cancellable context makes pgx start a watcher goroutine
// per query.
type conn struct{ *pgx.Conn }

func (c *conn) Reusable() bool { return !c.IsClosed() && c.PgConn().TxStatus() == 'I' }

// Close sends Terminate on a connection that is open but unusable: it ends
// cleanly, and the server rolls back what it held.
func (c *conn) Close() {
	if !c.IsClosed() {
		_ = c.Conn.Close(context.Background())
	}
}

func (s *store) Init(ctx context.Context, raw []byte, host sdk.HostInfo) (sdk.Manifest, error) {
	cfg, err := sqlkv.Configure(raw, host, parseConfig)
	if err != nil {
		return sdk.Manifest{}, err
	}
	pcfg, err := pgx.ParseConfig(cfg.url)
	if err != nil {
		return sdk.Manifest{}, fmt.Errorf("%w: url: %v", sdk.ErrInvalid, err)
	}
	// Connections go through the host's sockets, which check the address
	// against the operator's allow-list; names are passed through as they
	// are (the host matches them literally) since nothing resolves them
	// in here.
	pcfg.DialFunc = sdk.Dial
	pcfg.LookupFunc = func(_ context.Context, host string) ([]string, error) { return []string{host}, nil }
	s.cfg = cfg
	s.table = pgx.Identifier(cfg.Table).Sanitize()
	s.drv = &adaptor{sql: newStatements(s.table)}
	s.pool = sqlkv.NewPool(cfg.Conns, func(ctx context.Context) (*conn, error) {
		c, err := pgx.ConnectConfig(ctx, pcfg)
		if err != nil {
			return nil, err
		}
		return &conn{c}, nil
	})
	s.pageBytes = sqlkv.PageBytes(host)

	c, err := sqlkv.Connect(ctx, s.pool, s.drv, "PostgreSQL", pcfg.Host+":"+strconv.Itoa(int(pcfg.Port)), "url")
	if err != nil {
		return sdk.Manifest{}, err
	}
	defer s.pool.Put(c)
	if err := s.prepareTable(c); err != nil {
		return sdk.Manifest{}, err
	}
	return sqlkv.Manifest("postgres", "1.0.0"), nil
}

// prepareTable checks the server version and creates the table if it does
// not exist, then checks that it has the expected columns. A connection an
// error leaves inside a transaction is closed by the pool.
func (s *store) prepareTable(c *conn) error {
	qctx := context.Background()
	if v, err := strconv.Atoi(c.PgConn().ParameterStatus("server_version_num")); err == nil && v < minServerVersion {
		return fmt.Errorf("%w: PostgreSQL %s is too old: the table uses stored generated columns (PostgreSQL 12 or newer)",
			sdk.ErrInvalid, c.PgConn().ParameterStatus("server_version"))
	}
	var exists bool
	if err := c.QueryRow(qctx, `SELECT to_regclass($1) IS NOT NULL`, s.table).Scan(&exists); err != nil {
		return fmt.Errorf("checking for table %s: %w", s.table, classify(err))
	}
	if !exists {
		// Several instances (and Engram servers) start at once; the
		// transaction-scoped advisory lock serialises their CREATE, which
		// would otherwise race on the catalog. The lock key is arbitrary
		// but fixed ("engram" in ASCII).
		b := &pgx.Batch{}
		b.Queue(`BEGIN`)
		b.Queue(`SELECT pg_advisory_xact_lock(111542359123309)`)
		if err := c.SendBatch(qctx, b).Close(); err != nil {
			return fmt.Errorf("creating table %s: %w", s.table, classify(err))
		}
		// The existence check is repeated under the lock (another
		// instance may have won); CREATE ... IF NOT EXISTS would be
		// simpler but needs the CREATE privilege even when the table
		// exists.
		err := c.QueryRow(qctx, `SELECT to_regclass($1) IS NOT NULL`, s.table).Scan(&exists)
		if err == nil && !exists {
			_, err = c.Exec(qctx, s.drv.sql.create)
		}
		if err != nil {
			_, _ = simpleExec(c, `ROLLBACK`)
			return fmt.Errorf("creating table %s: %w", s.table, classify(err))
		}
		if _, err := simpleExec(c, `COMMIT`); err != nil {
			return fmt.Errorf("creating table %s: %w", s.table, classify(err))
		}
	}
	if _, err := c.Exec(qctx, s.drv.sql.probe); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42703" { // undefined_column
			return fmt.Errorf("%w: table %s exists but is not an Engram table (want columns internal_key, value, key_head, key_tail_hash): %v",
				sdk.ErrInvalid, s.table, err)
		}
		return fmt.Errorf("reading table %s: %w", s.table, classify(err))
	}
	return nil
}

func (s *store) Get(ctx context.Context, key []byte) ([]byte, error) {
	return sqlkv.Query(ctx, s.pool, s.drv, "get", func(c *conn) ([]byte, error) {
		var v []byte
		err := c.QueryRow(context.Background(), s.drv.sql.get, key).Scan(&v)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, sdk.ErrNotFound
		}
		return v, err
	})
}

func (s *store) Close(context.Context) error {
	s.pool.CloseAll()
	return nil
}

// Stale: PostgreSQL ends a session it terminates while idle
// (idle_session_timeout, pg_terminate_backend, a shutdown) with a FATAL
// error that pgx reads as the answer to the next statement, and a
// connection that a restart or a proxy dropped fails on its first read or
// write; either way pgx has closed the connection. A timeout is the call's
// own, not the connection's.
func (d *adaptor) Stale(c *conn, err error) bool {
	var ne net.Error
	return c.IsClosed() && !pgconn.Timeout(err) && !(errors.As(err, &ne) && ne.Timeout()) && !errors.Is(err, context.DeadlineExceeded)
}

// SQLSTATEs the plugin handles specially.
const (
	codeSerialization = "40001"
	codeDeadlock      = "40P01"
	codeQueryCanceled = "57014"
)

// Retryable reports whether err is a transaction the server aborted so that
// running it again may succeed.
func (d *adaptor) Retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == codeSerialization || pe.Code == codeDeadlock)
}

// classify wraps a driver error with the SDK error that selects its
// status; err stays in the chain for the message. It is for errors whose
// outcome is known not to have changed anything (reads, and writes before
// COMMIT was sent).
//
//   - timeouts (the host's deadline on the socket, statement_timeout) are
//     DEADLINE;
//   - a lost or refused connection, the server shutting down or starting up,
//     too many connections, and serialization failures and deadlocks that
//     outlived the retries are UNAVAILABLE: a retry may succeed;
//   - everything else (SQL errors, permissions, a dropped table) is
//     INTERNAL.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == codeQueryCanceled:
			return fmt.Errorf("%w: %w", sdk.ErrDeadline, err)
		case pe.Code == codeSerialization, pe.Code == codeDeadlock,
			pe.Code == "53300",                                         // too_many_connections
			pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03", // shutting down, crashed, starting up
			pe.Code == "57P05",                       // idle session timeout
			len(pe.Code) == 5 && pe.Code[:2] == "08": // connection exceptions
			return fmt.Errorf("%w: %w", sdk.ErrUnavailable, err)
		}
		return err
	}
	return sqlkv.ClassifyTransport(err, pgconn.Timeout(err))
}

// Classify is classify, for sqlkv.
func (d *adaptor) Classify(err error) error { return classify(err) }

// simpleExec runs a transaction-control statement with the simple query
// protocol: one round trip, never a prepared statement (pgx would prepare
// it on first use per connection, a round trip more), and the statement
// text on the wire every time.
func simpleExec(c *conn, sql string) (pgconn.CommandTag, error) {
	res, err := c.PgConn().Exec(context.Background(), sql).ReadAll()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	if len(res) != 1 {
		return pgconn.CommandTag{}, fmt.Errorf("%s: %d results", sql, len(res))
	}
	return res[0].CommandTag, res[0].Err
}
