package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/engramkv/engram/internal/mysqltest"
	"github.com/engramkv/engram/internal/pgtest"
	"github.com/engramkv/engram/internal/proctest"
)

// The SQL stores: Engram on its wasm adaptors and kine, each on a
// throwaway database server the harness starts, with a fresh database for
// every store run.
const (
	storePostgres     = "engram-postgres"
	storeMySQL        = "engram-mysql"
	storeKinePostgres = "kine-postgres"
	storeKineMySQL    = "kine-mysql"
)

// sqlStores are the SQL stores in report order, by database.
var sqlStores = []string{storePostgres, storeKinePostgres, storeMySQL, storeKineMySQL}

// sqlDatabase is the database server a SQL store runs on.
func sqlDatabase(store string) string {
	switch store {
	case storePostgres, storeKinePostgres:
		return dbPostgres
	case storeMySQL, storeKineMySQL:
		return dbMariaDB
	}
	return ""
}

const (
	dbPostgres = "PostgreSQL"
	dbMariaDB  = "MariaDB"
)

// isKine reports whether store is kine rather than Engram.
func isKine(store string) bool { return store == storeKinePostgres || store == storeKineMySQL }

// kineWorkloads are what kine is measured on. kine accepts only the
// transaction shapes kube-apiserver sends (create, update, delete of one
// key), so engram bench's preload (transactions of many puts) is refused,
// and with it every workload that reads or changes preloaded keys.
const kineWorkloads = "create"

// storeBenchArgs are the engram bench flags a store needs beyond the common
// ones: kine refuses DeleteRange, so the create workload's cleanup (which
// deletes its keys in ranges) is left out; every kine run has a database of
// its own anyway.
func storeBenchArgs(store string) []string {
	if isKine(store) {
		return []string{"--cleanup=false"}
	}
	return nil
}

// The database servers' settings, the same for Engram and kine. Durability
// is each server's default (PostgreSQL: fsync, synchronous_commit and
// full_page_writes on; MariaDB: the redo log flushed at every commit,
// doublewrite on; no binary log, as neither store needs one). Memory is
// sized so the benchmark's data fits in the buffer pool, and
// max_connections leaves room for kine's unbounded pool (300 clients).
var (
	pgSettings    = []string{"shared_buffers=256MB", "max_connections=500"}
	mysqlSettings = []string{"--innodb-buffer-pool-size=256M", "--max-connections=500"}
)

// sqlServers holds the database servers of one harness run, started on
// first need and stopped by stop.
type sqlServers struct {
	pg      *pgtest.Server
	my      *mysqltest.Server
	created int // databases created so far, for fresh names
}

// startSQL starts the database servers the chosen stores need.
func (h *harness) startSQL() error {
	need := map[string]bool{}
	for _, s := range h.stores {
		if db := sqlDatabase(s); db != "" {
			if _, skip := h.skipped[s]; !skip {
				need[db] = true
			}
		}
	}
	if need[dbPostgres] {
		pg, err := pgtest.LaunchWith(pgtest.Options{Durable: true, Settings: pgSettings})
		if err := h.judgeStart(dbPostgres, "PostgreSQL", pgtest.ErrNotInstalled, err); err != nil {
			return err
		}
		h.sql.pg = pg
	}
	if need[dbMariaDB] {
		my, err := mysqltest.LaunchWith(mysqltest.Options{Durable: true, Settings: mysqlSettings})
		if err := h.judgeStart(dbMariaDB, "MariaDB", mysqltest.ErrNotInstalled, err); err != nil {
			return err
		}
		h.sql.my = my
	}
	if h.sql.pg != nil {
		h.versions["postgresql"] = h.sql.pg.Version
	}
	if h.sql.my != nil {
		h.versions["mariadb"] = h.sql.my.Version
	}
	return nil
}

// judgeStart judges the outcome err of starting db's server, named name.
// A server whose binaries are missing (notInstalled) skips db's stores with
// a note, except under CI, where that is a broken machine; any other
// failure ends the run.
func (h *harness) judgeStart(db, name string, notInstalled, err error) error {
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, notInstalled):
		return fmt.Errorf("start %s: %w", name, err)
	case os.Getenv("CI") != "":
		return fmt.Errorf("%s is required under CI: %w", db, err)
	}
	for _, s := range h.stores {
		if sqlDatabase(s) == db {
			h.skipped[s] = fmt.Sprintf("%s is not installed (%v)", db, err)
		}
	}
	h.log.Warn("skipping the stores on "+db, "err", err)
	return nil
}

// stop stops the database servers and removes their data.
func (s *sqlServers) stop() {
	if s.pg != nil {
		_ = s.pg.Stop()
	}
	if s.my != nil {
		_ = s.my.Stop()
	}
}

// newDatabase creates an empty database on the server store runs on and
// returns its name and the server's address.
func (h *harness) newDatabase(store string) (name, addr string, err error) {
	h.sql.created++
	name = fmt.Sprintf("bench%d", h.sql.created)
	switch sqlDatabase(store) {
	case dbPostgres:
		if h.sql.pg == nil {
			return "", "", errors.New("PostgreSQL is not running")
		}
		_, err = h.sql.pg.Exec("", "CREATE DATABASE "+name)
		addr = h.sql.pg.Addr
	case dbMariaDB:
		if h.sql.my == nil {
			return "", "", errors.New("MariaDB is not running")
		}
		_, err = h.sql.my.Exec("", "CREATE DATABASE "+name)
		addr = h.sql.my.Addr
	default:
		return "", "", fmt.Errorf("%s is not a SQL store", store)
	}
	if err != nil {
		return "", "", fmt.Errorf("create database: %w", err)
	}
	return name, addr, nil
}

// sqlArgs returns the command line of a SQL store on a fresh database, and
// for Engram its metrics address (kine serves no pprof, so the harness
// reads only its process).
func (h *harness) sqlArgs(store, endpoint, dataDir string) (bin string, args []string, httpAddr string, err error) {
	db, addr, err := h.newDatabase(store)
	if err != nil {
		return "", nil, "", err
	}
	if isKine(store) {
		mp, err := freePort()
		if err != nil {
			return "", nil, "", err
		}
		dsn := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", "postgres", addr, db)
		if store == storeKineMySQL {
			dsn = fmt.Sprintf("mysql://root@tcp(%s)/%s", addr, db)
		}
		// kine's connection pool keeps its defaults (at most 20 idle
		// connections, no cap on open ones), as k3s runs it.
		return h.kineBin, []string{"--endpoint=" + dsn, "--listen-address=" + endpoint,
			fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp)}, "", nil
	}
	hp, err := freePort()
	if err != nil {
		return "", nil, "", err
	}
	httpAddr = fmt.Sprintf("127.0.0.1:%d", hp)
	wasm, cfg := h.postgresWasm, fmt.Sprintf("url=postgres://postgres@%s/%s?sslmode=disable", addr, db)
	if store == storeMySQL {
		wasm, cfg = h.mysqlWasm, fmt.Sprintf("dsn=root@tcp(%s)/%s", addr, db)
	}
	// The compiled plugin is cached across runs (compiling pgx takes
	// 15-20 s); the adaptor keeps its defaults: storage.wasm.pool-size 4
	// instances of up to 4 connections each (one for reads and commits,
	// the others for long scans).
	cache, err := proctest.WasmCacheDir(wasm)
	if err != nil {
		return "", nil, "", err
	}
	args = []string{"serve", "--listen-client-urls=http://" + endpoint, "--http.listen=" + httpAddr,
		"--data-dir=" + dataDir, "--log.level=warn",
		"--storage.engine=wasm", "--storage.wasm.file=" + wasm, "--storage.wasm.config=" + cfg,
		"--storage.wasm.allowed-addresses=" + addr, "--storage.wasm.cache-dir=" + cache}
	return h.engramBin, args, httpAddr, nil
}

// checkSQLStores skips the SQL stores whose plugin or kine binary is not
// built.
func (h *harness) checkSQLStores() {
	for _, s := range h.stores {
		var file string
		switch {
		case isKine(s):
			file = h.kineBin
		case s == storePostgres:
			file = h.postgresWasm
		case s == storeMySQL:
			file = h.mysqlWasm
		default:
			continue
		}
		if _, err := os.Stat(file); err != nil {
			h.skipped[s] = fmt.Sprintf("%s is missing (make bench-tools builds it)", file)
		}
	}
}

// sqlSettingsNote describes the database servers' settings for the report.
func sqlSettingsNote() string {
	return "PostgreSQL: its defaults (fsync, synchronous_commit, full_page_writes on) with `" + strings.Join(pgSettings, "`, `") +
		"`; MariaDB: its defaults (innodb_flush_log_at_trx_commit=1, doublewrite on), no binary log, with `" + strings.Join(mysqlSettings, "`, `") + "`"
}
