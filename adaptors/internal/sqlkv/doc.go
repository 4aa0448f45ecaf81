// Package sqlkv holds what Engram's SQL storage adaptors share whatever
// their driver: the KEY=VALUE configuration with its common settings, the
// per-instance connection pool (with the re-run of a call whose pooled
// connection had died while idle), the commit loop (key-ordered
// statements, retries of transactions the server aborted, and the rule
// that only a COMMIT left unanswered is UNCERTAIN), and the head+hash
// layout of keys in a table.
//
// An adaptor supplies a Driver: SQL text, driver calls and the
// classification of its server's errors. This package must not know any
// SQL dialect or driver, and like every plugin package it must not start
// goroutines, resolve names, touch a file system or keep state outside
// the values its callers hold.
package sqlkv
