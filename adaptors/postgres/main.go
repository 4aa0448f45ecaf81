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
// back. It must not keep any state but connections between calls (the
// instance model is pooled: instances are interchangeable and may be
// replaced at any time), must not start goroutines that need to run
// between calls, and must not resolve names (there is no DNS inside wasm).
//
// Configuration and schema: see config and schema. Build:
//
//	make build  # bin/postgres.wasm; by hand, from adaptors/:
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

	"github.com/engramkv/engram/sdk"
)

func main() { sdk.Serve(&store{}) }

// minServerVersion is PostgreSQL 12: stored generated columns.
const minServerVersion = 120000

// store is one instance's state: the configuration and its connections.
type store struct {
	cfg   config
	table string
	sql   *statements
	pool  *connPool
	// pageBytes bounds the bytes of one scan page, so a page of 4 MiB
	// values cannot exhaust the instance's memory.
	pageBytes int
}

func (s *store) Init(ctx context.Context, raw []byte, host sdk.HostInfo) (sdk.Manifest, error) {
	cfg, err := parseConfig(raw)
	if err != nil {
		return sdk.Manifest{}, err
	}
	if !host.NetAllowed {
		return sdk.Manifest{}, fmt.Errorf("%w: the host allows no network address; add the database's IP:PORT to storage.wasm.allowed-addresses", sdk.ErrInvalid)
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
	s.table = pgx.Identifier(cfg.table).Sanitize()
	s.sql = newStatements(s.table)
	s.pool = &connPool{cfg: pcfg, max: cfg.conns}
	s.pageBytes = min(max(host.MaxResponse/4, 1<<20), 16<<20)

	c, err := s.pool.get(ctx)
	if err != nil {
		if errors.Is(err, sdk.ErrAddressNotAllowed) {
			return sdk.Manifest{}, fmt.Errorf("%w: connecting to %s: %v (storage.wasm.allowed-addresses must list it exactly as in url)", sdk.ErrInvalid, pcfg.Host+":"+strconv.Itoa(int(pcfg.Port)), err)
		}
		return sdk.Manifest{}, fmt.Errorf("connecting to PostgreSQL at %s:%d: %w", pcfg.Host, pcfg.Port, classify(err))
	}
	defer s.pool.put(c)
	if err := s.prepareTable(ctx, c); err != nil {
		return sdk.Manifest{}, err
	}
	return sdk.Manifest{
		Name:    "postgres",
		Version: "1.0.0",
		Model:   sdk.ModelPooled,
		Durable: true,
	}, nil
}

// prepareTable checks the server version and creates the table if it does
// not exist, then checks that it has the expected columns.
func (s *store) prepareTable(ctx context.Context, c *pgx.Conn) error {
	qctx := queryContext(ctx)
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
			s.pool.discard(c)
			return fmt.Errorf("creating table %s: %w", s.table, classify(err))
		}
		// The existence check is repeated under the lock (another
		// instance may have won); CREATE ... IF NOT EXISTS would be
		// simpler but needs the CREATE privilege even when the table
		// exists.
		err := c.QueryRow(qctx, `SELECT to_regclass($1) IS NOT NULL`, s.table).Scan(&exists)
		if err == nil && !exists {
			_, err = c.Exec(qctx, s.sql.create)
		}
		if err != nil {
			_, _ = simpleExec(qctx, c, `ROLLBACK`)
			return fmt.Errorf("creating table %s: %w", s.table, classify(err))
		}
		if _, err := simpleExec(qctx, c, `COMMIT`); err != nil {
			return fmt.Errorf("creating table %s: %w", s.table, classify(err))
		}
	}
	if _, err := c.Exec(qctx, s.sql.probe); err != nil {
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
	c, err := s.pool.get(ctx)
	if err != nil {
		return nil, fmt.Errorf("get: %w", classify(err))
	}
	defer s.pool.put(c)
	var v []byte
	err = c.QueryRow(queryContext(ctx), s.sql.get, key).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, sdk.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("get: %w", classify(err))
	}
	return v, nil
}

func (s *store) Close(ctx context.Context) error {
	if s.pool != nil {
		s.pool.closeAll(ctx)
	}
	return nil
}

// queryContext is the context pgx runs queries under: without the
// request's deadline. A deadline inside the guest cannot interrupt a
// blocked host read anyway (the host applies it to the socket), and a
// cancellable context makes pgx start a watcher goroutine per query.
func queryContext(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// connPool holds one instance's connections. The instance serves one call
// at a time, so there is no locking; a connection is either idle, serving
// the current call, or held by an open scan.
type connPool struct {
	cfg   *pgx.ConnConfig
	max   int
	idle  []*pgx.Conn
	open  int
	scans int // connections held by open scans
}

// holdForScan counts a connection the caller got as held by a scan until
// releaseScan. Scans may hold all connections but one, which stays for
// Get and Commit: a burst of long scans must fail those scans, not
// Engram's writes.
func (p *connPool) holdForScan() error {
	if p.scans >= p.max-1 {
		return fmt.Errorf("%w: %d open scans hold all connections of this instance that scans may use (raise pool-size, now %d)", sdk.ErrUnavailable, p.scans, p.max)
	}
	p.scans++
	return nil
}

func (p *connPool) releaseScan() { p.scans-- }

// get returns an idle connection or opens one. It fails when every
// connection is held by an open scan: nothing would release one while the
// instance waits.
func (p *connPool) get(ctx context.Context) (*pgx.Conn, error) {
	for len(p.idle) > 0 {
		c := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if !c.IsClosed() {
			return c, nil
		}
		p.open--
	}
	if p.open >= p.max {
		return nil, fmt.Errorf("%w: all %d connections of this instance are held by open scans (raise pool-size)", sdk.ErrUnavailable, p.max)
	}
	c, err := pgx.ConnectConfig(ctx, p.cfg)
	if err != nil {
		return nil, err
	}
	p.open++
	return c, nil
}

// put returns a connection. One that is broken or still inside a
// transaction (an error left it there) is closed instead: reusing it
// would run the next statement in the wrong transaction.
func (p *connPool) put(c *pgx.Conn) {
	if c.IsClosed() || c.PgConn().TxStatus() != 'I' {
		p.discard(c)
		return
	}
	p.idle = append(p.idle, c)
}

// discard closes a connection the caller holds.
func (p *connPool) discard(c *pgx.Conn) {
	p.open--
	if !c.IsClosed() {
		// Close sends Terminate: a connection that is open but unusable
		// ends cleanly, and the server rolls back what it held.
		_ = c.Close(context.Background())
	}
}

func (p *connPool) closeAll(ctx context.Context) {
	for _, c := range p.idle {
		_ = c.Close(queryContext(ctx))
	}
	p.idle = nil
	p.open = 0
}

// SQLSTATEs the plugin handles specially.
const (
	codeSerialization = "40001"
	codeDeadlock      = "40P01"
	codeQueryCanceled = "57014"
)

// retryable reports whether err is a transaction the server aborted so that
// running it again may succeed.
func retryable(err error) bool {
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
			len(pe.Code) == 5 && pe.Code[:2] == "08": // connection exceptions
			return fmt.Errorf("%w: %w", sdk.ErrUnavailable, err)
		}
		return err
	}
	var ne net.Error
	switch {
	case errors.Is(err, sdk.ErrUnavailable), errors.Is(err, sdk.ErrInvalid), errors.Is(err, sdk.ErrDeadline):
		return err
	case pgconn.Timeout(err), errors.As(err, &ne) && ne.Timeout(), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", sdk.ErrDeadline, err)
	}
	// Anything else from the driver without a server error is the
	// connection failing: refused, reset, closed.
	return fmt.Errorf("%w: %w", sdk.ErrUnavailable, err)
}

// simpleExec runs a transaction-control statement with the simple query
// protocol: one round trip, never a prepared statement (pgx would prepare
// it on first use per connection, a round trip more), and the statement
// text on the wire every time.
func simpleExec(ctx context.Context, c *pgx.Conn, sql string) (pgconn.CommandTag, error) {
	res, err := c.PgConn().Exec(ctx, sql).ReadAll()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	if len(res) != 1 {
		return pgconn.CommandTag{}, fmt.Errorf("%s: %d results", sql, len(res))
	}
	return res[0].CommandTag, res[0].Err
}

// nonNil turns a nil slice into an empty one: pgx sends nil as NULL, and
// the contract makes a nil value the empty value.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// appendCopy appends b to arena and returns the copy, capped so later
// appends cannot overwrite it.
func appendCopy(arena *[]byte, b []byte) []byte {
	o := len(*arena)
	*arena = append(*arena, b...)
	return (*arena)[o:len(*arena):len(*arena)]
}
