// Package adaptors holds the storage adaptors Engram ships for production:
// WebAssembly plugins, built with the Go SDK (github.com/engramkv/engram/wasm/sdk),
// that keep Engram's data in an operator's existing database. `make build`
// builds each into bin/NAME.wasm beside bin/engram:
//
//   - postgres: PostgreSQL 12 or newer, through pgx.
//   - mysql: MySQL 8 or MariaDB 10.6 or newer (InnoDB), through
//     go-sql-driver/mysql.
//
// Each is a pooled, stateless client of its database: every instance holds
// only connections, so the host may run several and replace any of them.
// The README's "Run on PostgreSQL" and "Run on MySQL or MariaDB" sections
// show how to deploy them; `engram plugin verify` runs the adaptor
// conformance suite against either.
//
// Each adaptor's tests sit beside it (postgres/postgres_test.go,
// mysql/mysql_test.go) and run it as Engram does: compiled from bin/, through
// the wasm host, on a throwaway database that internal/pgtest or
// internal/mysqltest starts; what both check alike is internal/sqltest. The
// tests are host code and are never built for wasip1, which is why this
// module requires the main module: only its tests use it.
//
// Plugins used only by tests (memkv, faulty) live in wasm/testplugins/. This
// module must not be imported by Engram itself: adaptors are loaded as .wasm
// files, never linked, and an adaptor must not depend on anything a plugin
// cannot run (the server's packages, cgo, DNS, a file system).
package adaptors
