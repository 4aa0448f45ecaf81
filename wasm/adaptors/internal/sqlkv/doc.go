// Package sqlkv holds what Engram's SQL storage adaptors share whatever
// their driver: the KEY=VALUE configuration with its common settings, the
// per-instance connection pool (with the re-run of a call whose pooled
// connection had died while idle, and Do and Query for the one-statement
// calls: GET, SIZE, RECLAIM), what Init does alike (Configure, PageBytes,
// the first connection), the commit loop (key-ordered
// statements, split into runs of one kind that an adaptor may write as one
// multi-row statement each, retries of transactions the server aborted,
// and the rule that only a COMMIT left unanswered is UNCERTAIN), the scan
// iterator (a single statement for a scan that fits in one page, a
// snapshot transaction on a held connection for a longer one), and the
// head+hash layout of keys in a table.
//
// An adaptor supplies a Driver and a Pager: SQL text, driver calls, the
// classification of its server's errors, and where a scan's next page
// starts in its table's order. This package must not know any SQL
// dialect or driver, and like every plugin package it must not start
// goroutines, resolve names, touch a file system or keep state outside
// the values its callers hold.
package sqlkv
