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
// the same order, and a failed one rolls everything back; SIZE is the
// table's DATA_LENGTH + INDEX_LENGTH (lagging InnoDB's statistics) and
// RECLAIM is OPTIMIZE TABLE, except on Galera (space.go). It must not keep
// any state but connections between calls (the instance model is pooled:
// instances are interchangeable and may be replaced at any time), must not
// start goroutines that need to run between calls, and must not resolve
// names (there is no DNS inside wasm).
//
// It talks to the driver's driver.Conn directly, not through database/sql:
// one call runs at a time, so a pool is a slice (sqlkv.Pool), and
// database/sql's opener goroutine and per-query bookkeeping buy nothing.
// The driver still starts one goroutine per connection to watch contexts;
// it only wakes for a cancellable context, and statements run under
// context.Background (the host's deadline applies to the socket), so it
// stays parked. Statements go as text with their values inline (appendLit)
// and several per round trip (CLIENT_MULTI_STATEMENTS): a 3-op commit is
// two round trips, where prepared statements would take one per op plus
// BEGIN and COMMIT (DESIGN.md, "Statements per round trip in the SQL
// adaptors").
//
// What does not depend on the driver (the common settings, the connection
// pool, the commit loop, the scan iterator) is wasm/adaptors/internal/sqlkv's;
// this package keeps the SQL, the driver calls and what the server's errors
// mean.
//
// Configuration and schema: see config and schema. Build:
//
//	make adaptors  # bin/mysql.wasm; by hand, from wasm/adaptors/:
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o ../bin/mysql.wasm ./mysql
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/engramkv/engram/wasm/adaptors/internal/sqlkv"
	"github.com/engramkv/engram/wasm/sdk"
)

func main() { sqlkv.Serve(&store{}) }

// minPacket is the smallest max_allowed_packet the plugin accepts: one
// statement carries a value of up to 4 MiB and its key, each escaped
// (up to twice as long).
const minPacket = 2*(4<<20+maxKeyLen) + 64<<10

// store is one instance's state: the configuration and its connections.
type store struct {
	cfg       config
	drv       *adaptor
	pool      *sqlkv.Pool[*conn]
	pageBytes int // sqlkv.PageBytes
}

// adaptor is the plugin's side of sqlkv's shared logic.
type adaptor struct {
	sql statements
	// maxPacket is the server's max_allowed_packet: a commit's statements
	// are sent in as few round trips as fit in it.
	maxPacket int
	buf       []byte // statement text, reused across calls
}

func (s *store) Init(ctx context.Context, raw []byte, host sdk.HostInfo) (sdk.Manifest, error) {
	cfg, err := sqlkv.Configure(raw, host, parseConfig)
	if err != nil {
		return sdk.Manifest{}, err
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
	s.drv = &adaptor{sql: statements{table: cfg.quotedTable(), where: cfg.tableWhere()}}
	var dialled *trackedConn
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
		dialled = &trackedConn{Conn: c}
		return dialled, nil
	}
	connector, err := mysql.NewConnector(d)
	if err != nil {
		return sdk.Manifest{}, fmt.Errorf("%w: dsn: %v", sdk.ErrInvalid, err)
	}
	s.pool = sqlkv.NewPool(cfg.Conns, func(ctx context.Context) (*conn, error) {
		return connect(ctx, connector, &dialled)
	})
	s.pageBytes = sqlkv.PageBytes(host)

	c, err := sqlkv.Connect(ctx, s.pool, s.drv, "MySQL", d.Addr, "dsn")
	if err != nil {
		return sdk.Manifest{}, err
	}
	defer s.pool.Put(c)
	dsnWait, dsnSets := d.Params["wsrep_sync_wait"]
	wait, err := causalReads(c, dsnWait, dsnSets)
	if err != nil {
		return sdk.Manifest{}, err
	}
	if wait != "" {
		// Later connections set it as the driver sets every param; this
		// one is already open.
		d.Params["wsrep_sync_wait"] = wait
		if connector, err = mysql.NewConnector(d); err != nil {
			return sdk.Manifest{}, fmt.Errorf("%w: dsn: %v", sdk.ErrInvalid, err)
		}
		if err := c.exec("SET SESSION wsrep_sync_wait=" + wait); err != nil {
			return sdk.Manifest{}, fmt.Errorf("setting wsrep_sync_wait: %w", classify(err))
		}
	}
	if err := s.prepareTable(c); err != nil {
		return sdk.Manifest{}, err
	}
	return sqlkv.Manifest("mysql", "1.0.0"), nil
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
	s.drv.maxPacket, _ = strconv.Atoi(string(packet))
	if s.drv.maxPacket < minPacket {
		return fmt.Errorf("%w: the server's max_allowed_packet is %d bytes; Engram's 4 MiB values need at least %d (set max_allowed_packet=64M)", sdk.ErrInvalid, s.drv.maxPacket, minPacket)
	}
	name := s.cfg.Table[len(s.cfg.Table)-1]
	where := s.drv.sql.where
	engine, _, err := c.queryTwo(`SELECT ENGINE, NULL FROM information_schema.TABLES WHERE ` + where)
	if errors.Is(err, errNoRows) {
		// IF NOT EXISTS: several instances (and Engram servers) start at
		// once; the server serialises their CREATEs on the table's
		// metadata lock, and the losers get a warning. It is only sent
		// when the table is missing, so an existing table needs no CREATE
		// privilege.
		if err := c.exec(createSQL(s.drv.sql.table, name)); err != nil {
			return fmt.Errorf("creating table %s: %w", s.drv.sql.table, classify(err))
		}
		engine, _, err = c.queryTwo(`SELECT ENGINE, NULL FROM information_schema.TABLES WHERE ` + where)
	}
	if err != nil {
		return fmt.Errorf("checking for table %s: %w", s.drv.sql.table, classify(err))
	}
	notOurs := func(why string) error {
		return fmt.Errorf("%w: table %s exists but is not an Engram table (%s; want InnoDB with internal_key VARBINARY, value LONGBLOB, key_head VARBINARY, key_tail_hash VARBINARY, PRIMARY KEY (key_head, key_tail_hash))",
			sdk.ErrInvalid, s.drv.sql.table, why)
	}
	if !strings.EqualFold(string(engine), "InnoDB") {
		return notOurs(fmt.Sprintf("engine %q", engine))
	}
	rows, err := c.queryAll(`SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS WHERE ` + where + ` ORDER BY ORDINAL_POSITION`)
	if err != nil {
		return fmt.Errorf("reading the columns of %s: %w", s.drv.sql.table, classify(err))
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
		return fmt.Errorf("reading the primary key of %s: %w", s.drv.sql.table, classify(err))
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

// causalReads returns the wsrep_sync_wait every session must set on a
// Galera node, or "" when nothing needs setting: the server is not a
// Galera node, or its sessions already wait for reads. A Galera node
// applies the other nodes' writes asynchronously; a read there that does
// not first wait for them (wsrep_sync_wait's bit 1, which covers SELECT
// and START TRANSACTION) can miss a write another node already committed,
// and an Engram follower reading through it would answer with data older
// than a write already acknowledged. A dsn that sets the variable without
// that bit is refused rather than overridden: the operator asked for it.
func causalReads(c *conn, dsnValue string, dsnSets bool) (string, error) {
	on, wait, err := c.queryTwo(`SELECT @@wsrep_on, @@SESSION.wsrep_sync_wait`)
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == erUnknownSystemVariable {
		return "", nil // a server without Galera (MySQL)
	}
	if err != nil {
		return "", fmt.Errorf("reading wsrep_on: %w", classify(err))
	}
	if string(on) != "1" {
		return "", nil
	}
	n, err := strconv.Atoi(string(wait))
	if err != nil {
		return "", fmt.Errorf("reading wsrep_sync_wait: %q is not a number", wait)
	}
	if n&1 != 0 {
		return "", nil
	}
	if dsnSets {
		return "", fmt.Errorf("%w: dsn sets wsrep_sync_wait=%s on a Galera node, where reads could then miss writes other nodes acknowledged; use a value with bit 1 set (1, 3, 5 or 7) or leave it out", sdk.ErrInvalid, dsnValue)
	}
	return strconv.Itoa(n | 1), nil
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
	s.drv.buf = s.drv.sql.get(s.drv.buf[:0], key)
	return sqlkv.Query(ctx, s.pool, s.drv, "get", func(c *conn) ([]byte, error) {
		v, _, err := c.queryTwo(string(s.drv.buf))
		if errors.Is(err, errNoRows) {
			return nil, sdk.ErrNotFound
		}
		return v, err
	})
}

func (s *store) Close(context.Context) error {
	s.pool.CloseAll()
	return nil
}
