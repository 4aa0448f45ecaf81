// Command mysql is an Engram storage plugin that keeps Engram's internal
// keys in one InnoDB table of MySQL 8 or MariaDB 10.6 or newer, one row per
// key holding the key and its value (the layout of KubeBrain's SQL mapping),
// through go-sql-driver/mysql running inside the plugin over the host's
// sockets.
//
// It owns the mapping of the adaptor contract onto SQL: Get is a primary-key
// SELECT; a Scan is a snapshot (one START TRANSACTION WITH CONSISTENT
// SNAPSHOT, READ ONLY at REPEATABLE READ per scan that spans several
// batches) read in LIMITed keyset pages; a Commit is one READ COMMITTED
// transaction in which conditions are checked by the writes themselves
// (INSERT IGNORE, UPDATE/DELETE ... AND value = expected, counted with
// CLIENT_FOUND_ROWS), in key order so that concurrent batches lock rows in
// the same order, and a failed one rolls everything back. It must not keep
// any state but connections between calls (the instance model is pooled:
// instances are interchangeable and may be replaced at any time), must not
// start goroutines that need to run between calls, and must not resolve
// names (there is no DNS inside wasm).
//
// It talks to the driver's driver.Conn directly, not through database/sql:
// one call runs at a time, so a pool is a slice (connPool), and
// database/sql's opener goroutine and per-query bookkeeping buy nothing.
// The driver still starts one goroutine per connection to watch contexts;
// it only wakes for a cancellable context, and statements run under
// context.Background (the host's deadline applies to the socket), so it
// stays parked. Statements go as text with their
// values inline (appendLit) and several per round trip
// (CLIENT_MULTI_STATEMENTS): a 3-op commit is two round trips, where
// prepared statements would take one per op plus BEGIN and COMMIT.
//
// Configuration and schema: see config and schema. Build:
//
//	make adaptors  # bin/mysql.wasm; by hand, from adaptors/:
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o ../bin/mysql.wasm ./mysql
package main

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/engramkv/engram/sdk"
)

func main() { sdk.Serve(&store{}) }

// minPacket is the smallest max_allowed_packet the plugin accepts: one
// statement carries a value of up to 4 MiB and its key, each escaped
// (up to twice as long).
const minPacket = 2*(4<<20+maxKeyLen) + 64<<10

// store is one instance's state: the configuration and its connections.
type store struct {
	cfg  config
	sql  statements
	pool *connPool
	// pageBytes bounds the bytes of one scan page, so a page of 4 MiB
	// values cannot exhaust the instance's memory.
	pageBytes int
	// maxPacket is the server's max_allowed_packet: a commit's statements
	// are sent in as few round trips as fit in it.
	maxPacket int
	buf       []byte // statement text, reused across calls
}

func (s *store) Init(ctx context.Context, raw []byte, host sdk.HostInfo) (sdk.Manifest, error) {
	cfg, err := parseConfig(raw)
	if err != nil {
		return sdk.Manifest{}, err
	}
	if !host.NetAllowed {
		return sdk.Manifest{}, fmt.Errorf("%w: the host allows no network address; add the database's IP:PORT to storage.wasm.allowed-addresses", sdk.ErrInvalid)
	}
	d := cfg.dsn
	// The plugin depends on these: several statements per round trip,
	// values inline, and UPDATE counting matched rather than changed rows
	// (a CompareAndSwap to the value the key already holds succeeds).
	d.MultiStatements = true
	d.ClientFoundRows = true
	d.InterpolateParams = false
	d.ParseTime = false
	d.MaxAllowedPacket = 0 // ask the server
	d.Logger = discardLogger{}
	if d.Params == nil {
		d.Params = map[string]string{}
	}
	// Session settings: strict mode without NO_BACKSLASH_ESCAPES (appendLit
	// escapes with backslashes), and sorts that compare whole keys (only
	// the runs of keys sharing a 1024-byte head are sorted by the server,
	// and the default max_sort_length of 1024 would compare just that
	// head).
	d.Params["sql_mode"] = "'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'"
	d.Params["max_sort_length"] = strconv.Itoa(maxKeyLen + 1024)
	s.cfg = cfg
	s.sql = statements{table: cfg.quotedTable()}
	s.pool = &connPool{max: cfg.conns}
	// Connections go through the host's sockets, which check the address
	// against the operator's allow-list. The dialled socket is kept beside
	// the driver's connection: the driver reports every I/O failure as
	// "invalid connection", and classify needs to know a timeout from a
	// reset.
	d.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := sdk.Dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		s.pool.dialled = &trackedConn{Conn: c}
		return s.pool.dialled, nil
	}
	connector, err := mysql.NewConnector(d)
	if err != nil {
		return sdk.Manifest{}, fmt.Errorf("%w: dsn: %v", sdk.ErrInvalid, err)
	}
	s.pool.connector = connector
	s.pageBytes = min(max(host.MaxResponse/4, 1<<20), 16<<20)

	c, err := s.pool.get(ctx)
	if err != nil {
		if errors.Is(err, sdk.ErrAddressNotAllowed) {
			return sdk.Manifest{}, fmt.Errorf("%w: connecting to %s: %v (storage.wasm.allowed-addresses must list it exactly as in dsn)", sdk.ErrInvalid, d.Addr, err)
		}
		return sdk.Manifest{}, fmt.Errorf("connecting to MySQL at %s: %w", d.Addr, classify(err))
	}
	defer s.pool.put(c)
	if err := s.prepareTable(c); err != nil {
		return sdk.Manifest{}, err
	}
	return sdk.Manifest{
		Name:    "mysql",
		Version: "1.0.0",
		Model:   sdk.ModelPooled,
		Durable: true,
	}, nil
}

// prepareTable checks the server, creates the table if it does not exist,
// and checks that it is an Engram table: a table with the right names but
// another engine or column types (a case-insensitive VARCHAR, say) would
// be written into and silently misorder or lose keys.
func (s *store) prepareTable(c *conn) error {
	version, packet, err := c.queryTwo(`SELECT VERSION(), @@max_allowed_packet`)
	if err != nil {
		return fmt.Errorf("reading the server version: %w", classify(err))
	}
	if err := checkVersion(string(version)); err != nil {
		return err
	}
	s.maxPacket, _ = strconv.Atoi(string(packet))
	if s.maxPacket < minPacket {
		return fmt.Errorf("%w: the server's max_allowed_packet is %d bytes; Engram's 4 MiB values need at least %d (set max_allowed_packet=64M)", sdk.ErrInvalid, s.maxPacket, minPacket)
	}
	schemaExpr := "DATABASE()"
	name := s.cfg.table[len(s.cfg.table)-1]
	if len(s.cfg.table) == 2 {
		schemaExpr = "'" + s.cfg.table[0] + "'" // identRE admits no quote
	}
	where := fmt.Sprintf(`TABLE_SCHEMA = %s AND TABLE_NAME = '%s'`, schemaExpr, name)
	engine, _, err := c.queryTwo(`SELECT ENGINE, NULL FROM information_schema.TABLES WHERE ` + where)
	if errors.Is(err, errNoRows) {
		// IF NOT EXISTS: several instances (and Engram servers) start at
		// once; the server serialises their CREATEs on the table's
		// metadata lock, and the losers get a warning. It is only sent
		// when the table is missing, so an existing table needs no CREATE
		// privilege.
		if err := c.exec(createSQL(s.sql.table, name)); err != nil {
			return fmt.Errorf("creating table %s: %w", s.sql.table, classify(err))
		}
		engine, _, err = c.queryTwo(`SELECT ENGINE, NULL FROM information_schema.TABLES WHERE ` + where)
	}
	if err != nil {
		return fmt.Errorf("checking for table %s: %w", s.sql.table, classify(err))
	}
	notOurs := func(why string) error {
		return fmt.Errorf("%w: table %s exists but is not an Engram table (%s; want InnoDB with internal_key VARBINARY, value LONGBLOB, key_head VARBINARY, key_tail_hash VARBINARY, PRIMARY KEY (key_head, key_tail_hash))",
			sdk.ErrInvalid, s.sql.table, why)
	}
	if !strings.EqualFold(string(engine), "InnoDB") {
		return notOurs(fmt.Sprintf("engine %q", engine))
	}
	rows, err := c.queryAll(`SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS WHERE ` + where + ` ORDER BY ORDINAL_POSITION`)
	if err != nil {
		return fmt.Errorf("reading the columns of %s: %w", s.sql.table, classify(err))
	}
	want := map[string]string{"internal_key": "varbinary", "value": "longblob", "key_head": "varbinary", "key_tail_hash": "varbinary"}
	got := map[string]string{}
	for _, r := range rows {
		got[strings.ToLower(string(r[0]))] = strings.ToLower(string(r[1]))
	}
	for col, typ := range want {
		if got[col] != typ {
			return notOurs(fmt.Sprintf("column %s is %q", col, got[col]))
		}
	}
	rows, err = c.queryAll(`SELECT COLUMN_NAME, SEQ_IN_INDEX FROM information_schema.STATISTICS WHERE ` + where + ` AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX`)
	if err != nil {
		return fmt.Errorf("reading the primary key of %s: %w", s.sql.table, classify(err))
	}
	var pk []string
	for _, r := range rows {
		pk = append(pk, strings.ToLower(string(r[0])))
	}
	if strings.Join(pk, ",") != "key_head,key_tail_hash" {
		return notOurs(fmt.Sprintf("primary key (%s)", strings.Join(pk, ", ")))
	}
	return nil
}

// checkVersion refuses servers older than MySQL 8.0 or MariaDB 10.6.
func checkVersion(v string) error {
	major, minor := 0, 0
	parts := strings.SplitN(v, ".", 3)
	if len(parts) >= 2 {
		major, _ = strconv.Atoi(parts[0])
		minor, _ = strconv.Atoi(parts[1])
	}
	if strings.Contains(strings.ToLower(v), "mariadb") {
		if major < 10 || major == 10 && minor < 6 {
			return fmt.Errorf("%w: MariaDB %s is too old (10.6 or newer)", sdk.ErrInvalid, v)
		}
		return nil
	}
	if major < 8 {
		return fmt.Errorf("%w: MySQL %s is too old (8.0 or newer)", sdk.ErrInvalid, v)
	}
	return nil
}

func (s *store) Get(ctx context.Context, key []byte) ([]byte, error) {
	if len(key) > maxKeyLen {
		return nil, sdk.ErrNotFound // no such key can have been stored
	}
	s.buf = s.sql.get(s.buf[:0], key)
	for {
		c, err := s.pool.get(ctx)
		if err != nil {
			return nil, fmt.Errorf("get: %w", classify(err))
		}
		v, _, err := c.queryTwo(string(s.buf))
		s.pool.put(c)
		if errors.Is(err, errNoRows) {
			return nil, sdk.ErrNotFound
		}
		if c.stale(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("get: %w", classify(err))
		}
		return v, nil
	}
}

func (s *store) Close(context.Context) error {
	if s.pool != nil {
		s.pool.closeAll()
	}
	return nil
}

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
	// reused: the connection was idle in the pool before this call. The
	// server (wait_timeout), a restart or a proxy may have closed it
	// meanwhile, which shows only when it is used; see stale.
	reused bool
}

// stale reports whether err is c failing as a connection that died while
// idle: its first statement of the call got no answer. The call is run
// again on a new connection, which is safe because nothing was applied
// (the caller checks that COMMIT was not sent).
func (c *conn) stale(err error) bool {
	var me *mysql.MySQLError
	return c.reused && c.bad && err != nil && !errors.As(err, &me)
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
// connection can be reused; put discards it if that fails.
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

// connPool holds one instance's connections. The instance serves one call
// at a time, so there is no locking; a connection is either idle, serving
// the current call, or held by an open scan.
type connPool struct {
	connector driver.Connector
	dialled   *trackedConn // set by the dial function during Connect
	max       int
	idle      []*conn
	open      int
	scans     int // connections held by open scans
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
func (p *connPool) get(ctx context.Context) (*conn, error) {
	if n := len(p.idle); n > 0 {
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		c.reused = true
		return c, nil
	}
	return p.connect(ctx)
}

// connect opens a new connection.
func (p *connPool) connect(ctx context.Context) (*conn, error) {
	if p.open >= p.max {
		return nil, fmt.Errorf("%w: all %d connections of this instance are held by open scans (raise pool-size)", sdk.ErrUnavailable, p.max)
	}
	p.dialled = nil
	dc, err := p.connector.Connect(ctx)
	nc := p.dialled
	p.dialled = nil
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
	p.open++
	return c, nil
}

// put returns a connection. One that is broken or still inside a
// transaction (an error left it there) is closed instead: reusing it
// would run the next statement in the wrong transaction.
func (p *connPool) put(c *conn) {
	if c.bad || c.inTx {
		p.discard(c)
		return
	}
	p.idle = append(p.idle, c)
}

// discard closes a connection the caller holds. Close sends COM_QUIT on a
// connection that is still open, and the server rolls back what it held.
func (p *connPool) discard(c *conn) {
	p.open--
	_ = c.dc.Close()
}

func (p *connPool) closeAll() {
	for _, c := range p.idle {
		_ = c.dc.Close()
	}
	p.idle = nil
	p.open = 0
}

// Server error numbers the plugin handles specially.
const (
	erLockWaitTimeout = 1205
	erLockDeadlock    = 1213
)

// retryable reports whether err is a transaction the server aborted (a
// deadlock rolls back the whole transaction; a lock wait timeout the
// statement, and Commit rolls back the rest) so that running it again may
// succeed.
func retryable(err error) bool {
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
//     connections, and deadlocks and lock wait timeouts that outlived the
//     retries are UNAVAILABLE: a retry may succeed;
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
			1927,       // MariaDB: connection killed
			3032, 4031: // MySQL: offline mode; idle client disconnected
			return fmt.Errorf("%w: %w", sdk.ErrUnavailable, err)
		}
		return err
	}
	var ne net.Error
	switch {
	case errors.Is(err, sdk.ErrUnavailable), errors.Is(err, sdk.ErrInvalid), errors.Is(err, sdk.ErrDeadline):
		return err
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", sdk.ErrDeadline, err)
	case errors.Is(err, mysql.ErrPktTooLarge):
		return err
	}
	// Anything else from the driver without a server error is the
	// connection failing: refused, reset, closed.
	return fmt.Errorf("%w: %w", sdk.ErrUnavailable, err)
}

// nonNil turns a nil slice into an empty one: the contract makes a nil
// value the empty value.
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
