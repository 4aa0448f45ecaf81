package main

import (
	"fmt"
	"strconv"

	"github.com/engramkv/engram/wasm/adaptors/internal/sqlkv"
)

// headLen is how many leading key bytes the primary key holds (an InnoDB
// index entry is limited to 3072 bytes); see sqlkv.HeadLen and schema.
const headLen = sqlkv.HeadLen

// maxKeyLen is internal_key's declared length, the contract's MaxKeySize.
// Longer keys are refused before any SQL is built: strict mode would
// refuse them too, but INSERT IGNORE turns "too long" into a warning and
// truncates.
const maxKeyLen = 60000

// schema creates the table. Every key is stored whole in internal_key, as
// KubeBrain's SQL mapping lays it out; the primary key is over two columns
// derived from it, exactly as in the PostgreSQL adaptor:
//
//   - key_head, the first headLen bytes, which orders rows: VARBINARY
//     compares bytewise like bytes.Compare (memcmp, then the shorter first:
//     the binary collation has no PAD SPACE, so a trailing 0x00 or 0x20
//     byte makes a key greater), and a key's head never sorts after its
//     successors' heads;
//   - key_tail_hash, the SHA-256 of the bytes past the head (empty for the
//     usual short key), which makes long keys unique.
//
// MariaDB refuses generated columns in a primary key, so the plugin
// computes both columns and the CHECK constraint keeps rows written by
// hand honest (MySQL 8.0.16+ and MariaDB enforce it). ORDER BY key_head,
// internal_key would make the server sort the whole range (neither MySQL
// nor MariaDB sorts incrementally on an index prefix), so scans read in
// primary-key order and sort the rare runs of keys sharing a head
// themselves (scan.go).
const schema = "CREATE TABLE IF NOT EXISTS %[1]s (\n" +
	"\tinternal_key  VARBINARY(%[4]d) NOT NULL,\n" +
	"\tvalue         LONGBLOB NOT NULL,\n" +
	"\tkey_head      VARBINARY(%[2]d) NOT NULL,\n" +
	"\tkey_tail_hash VARBINARY(32) NOT NULL,\n" +
	"\tPRIMARY KEY (key_head, key_tail_hash),\n" +
	"\tCONSTRAINT %[5]s CHECK (key_head = LEFT(internal_key, %[2]d) AND key_tail_hash =\n" +
	"\t\tIF(LENGTH(internal_key) > %[2]d, UNHEX(SHA2(SUBSTRING(internal_key, %[3]d), 256)), ''))\n" +
	") ENGINE=InnoDB ROW_FORMAT=DYNAMIC"

// createSQL is schema for table (quoted) whose last name part is name.
// The constraint's name is per schema in MySQL, so it carries the table's.
func createSQL(table, name string) string {
	return fmt.Sprintf(schema, table, headLen, headLen+1, maxKeyLen, "`"+name+"_key_derivation`")
}

// appendLit appends b as a binary string literal. Statements are sent as
// text with their values inline (see the package doc for why); the
// escapes are those of mysql_real_escape_string, valid because every
// connection sets an sql_mode without NO_BACKSLASH_ESCAPES, and the
// _binary introducer keeps the connection's character set out of it.
func appendLit(buf, b []byte) []byte {
	buf = append(buf, "_binary'"...)
	start := 0
	for i, c := range b {
		var esc byte
		switch c {
		case 0:
			esc = '0'
		case '\n':
			esc = 'n'
		case '\r':
			esc = 'r'
		case 0x1a:
			esc = 'Z'
		case '\'', '"', '\\':
			esc = c
		default:
			continue
		}
		buf = append(buf, b[start:i]...)
		buf = append(buf, '\\', esc)
		start = i + 1
	}
	buf = append(buf, b[start:]...)
	return append(buf, '\'')
}

// litLen bounds the length of appendLit's output for n bytes.
func litLen(n int) int { return 2*n + 10 }

// appendMatch appends the primary-key condition for key.
func appendMatch(buf, key []byte) []byte {
	buf = append(buf, "key_head = "...)
	buf = appendLit(buf, sqlkv.KeyHead(key))
	buf = append(buf, " AND key_tail_hash = "...)
	return appendLit(buf, sqlkv.KeyTailHash(key))
}

// statements builds the SQL of one table.
type statements struct {
	table string // quoted
	// where selects the table's row in information_schema.TABLES and
	// its other views.
	where string
}

// size reads the table's data and index size (space.go says what the
// figure means). CAST makes it text, as every result the plugin reads.
func (s statements) size() string {
	return "SELECT CAST(DATA_LENGTH + INDEX_LENGTH AS CHAR), NULL FROM information_schema.TABLES WHERE " + s.where
}

// optimize rebuilds the table; on InnoDB it answers a note ("doing
// recreate + analyze instead") and a status row.
func (s statements) optimize() string { return "OPTIMIZE TABLE " + s.table }

func (s statements) get(buf, key []byte) []byte {
	buf = append(buf, "SELECT value FROM "...)
	buf = append(buf, s.table...)
	buf = append(buf, " WHERE "...)
	return appendMatch(buf, key)
}

// insert is the INSERT of a new row; verb is "INSERT" or "INSERT IGNORE".
func (s statements) insert(buf []byte, verb string, key, value []byte) []byte {
	return s.insertRow(s.insertHead(buf, verb), key, value)
}

// insertHead is an INSERT up to its VALUES, which insertRow appends, the
// rows separated by commas.
func (s statements) insertHead(buf []byte, verb string) []byte {
	buf = append(buf, verb...)
	buf = append(buf, " INTO "...)
	buf = append(buf, s.table...)
	return append(buf, " (internal_key, value, key_head, key_tail_hash) VALUES "...)
}

func (s statements) insertRow(buf, key, value []byte) []byte {
	buf = append(buf, '(')
	buf = appendLit(buf, key)
	buf = append(buf, ", "...)
	buf = appendLit(buf, value)
	buf = append(buf, ", "...)
	buf = appendLit(buf, sqlkv.KeyHead(key))
	buf = append(buf, ", "...)
	buf = appendLit(buf, sqlkv.KeyTailHash(key))
	return append(buf, ')')
}

// upsert ends an INSERT of insertHead("INSERT") as an upsert. VALUES(value)
// is deprecated in MySQL 8.0.20 but works in every version of both servers
// (MariaDB lacks the row alias that replaces it), and it avoids sending the
// value twice.
const upsert = " ON DUPLICATE KEY UPDATE value = VALUES(value)"

// put is an upsert.
func (s statements) put(buf, key, value []byte) []byte {
	return append(s.insert(buf, "INSERT", key, value), upsert...)
}

// putNew inserts only an absent key: 1 row affected, or 0 for a duplicate.
// IGNORE also downgrades other errors to warnings, but none can occur
// here: the key's length is checked, the value fits LONGBLOB, nothing is
// NULL and the derived columns are computed right.
func (s statements) putNew(buf, key, value []byte) []byte {
	return s.insert(buf, "INSERT IGNORE", key, value)
}

// cas updates key's value if it holds expected. The connection sets
// CLIENT_FOUND_ROWS, so a row that matched counts even when the new value
// equals the old one.
func (s statements) cas(buf, key, value, expected []byte) []byte {
	buf = appendLit(s.setValue(buf), value)
	return appendLit(whereKey(buf, key, " AND value = "), expected)
}

// setValue appends the head of an UPDATE of the value column, up to the
// new value's expression.
func (s statements) setValue(buf []byte) []byte {
	buf = append(buf, "UPDATE "...)
	buf = append(buf, s.table...)
	return append(buf, " SET value = "...)
}

// whereKey appends the WHERE clause that selects key's row, then and (the
// start of one more condition).
func whereKey(buf, key []byte, and string) []byte {
	buf = append(buf, " WHERE "...)
	return append(appendMatch(buf, key), and...)
}

// compare writes a compare-and-swap to the value the key already holds (a
// leader's fence, election.FenceOp) as three statements that change the
// row and change it back: an UPDATE to the row's own value changes nothing,
// so Galera would leave the row out of the writeset and could not certify
// the fence against the next leader's rewrite (DESIGN.md, "Fencing on
// Galera"). Only the first statement's count is the op's: whether the
// condition held; the last one changes the row back only then.
func (s statements) compare(buf, key, value []byte) []byte {
	buf = append(s.setValue(buf), "CONCAT(value, x'00')"...)
	buf = appendLit(whereKey(buf, key, " AND value = "), value)
	buf = append(buf, ";SET @engram_held = ROW_COUNT();"...)
	buf = appendLit(s.setValue(buf), value)
	return whereKey(buf, key, " AND @engram_held > 0")
}

// compareStatements is how many statements compare writes.
const compareStatements = 3

// The multi-row forms of compare-and-swap and compare-and-delete join the
// table with a derived table of the run's keys, new values and expected
// values, one SELECT per op joined by UNION ALL (MariaDB names a table
// value constructor's columns after its first row's values), in key order.
// The connection sets CLIENT_FOUND_ROWS, so the count is of the rows whose
// condition held, changed or not.
const (
	casManyTail = ") AS u ON t.key_head = u.h AND t.key_tail_hash = u.th SET t.value = u.v WHERE t.value = u.e"
	cadManyTail = ") AS u ON t.key_head = u.h AND t.key_tail_hash = u.th WHERE t.value = u.e"
)

func (s statements) casManyHead(buf []byte) []byte {
	buf = append(buf, "UPDATE "...)
	buf = append(buf, s.table...)
	return append(buf, " AS t JOIN ("...)
}

func (s statements) cadManyHead(buf []byte) []byte {
	buf = append(buf, "DELETE t FROM "...)
	buf = append(buf, s.table...)
	return append(buf, " AS t JOIN ("...)
}

// manyRow appends one op's row of the derived table: its key's head and
// tail hash, then value (for a swap) and expected. The first row names the
// columns.
func (s statements) manyRow(buf []byte, first bool, key, value, expected []byte) []byte {
	if first {
		buf = append(buf, "SELECT "...)
	} else {
		buf = append(buf, " UNION ALL SELECT "...)
	}
	name := func(n string) {
		if first {
			buf = append(buf, " AS "...)
			buf = append(buf, n...)
		}
	}
	buf = appendLit(buf, sqlkv.KeyHead(key))
	name("h")
	buf = append(buf, ", "...)
	buf = appendLit(buf, sqlkv.KeyTailHash(key))
	name("th")
	if value != nil {
		buf = append(buf, ", "...)
		buf = appendLit(buf, value)
		name("v")
	}
	buf = append(buf, ", "...)
	buf = appendLit(buf, expected)
	name("e")
	return buf
}

func (s statements) del(buf, key []byte) []byte {
	buf = append(buf, "DELETE FROM "...)
	buf = append(buf, s.table...)
	buf = append(buf, " WHERE "...)
	return appendMatch(buf, key)
}

func (s statements) cad(buf, key, expected []byte) []byte {
	buf = s.del(buf, key)
	buf = append(buf, " AND value = "...)
	return appendLit(buf, expected)
}

// bound is one side of a scan page's range on internal_key.
type bound struct {
	key       []byte // nil: unbounded
	inclusive bool
}

// pageQuery is one statement of a scan page, in one of two shapes:
//
//   - a group query (groupQuery): the keys whose head is group, in key
//     order (the server sorts just them, which share that head);
//   - a range query: the keys whose head is past group in the scan's
//     direction (every head, when group is nil) in primary-key order,
//     which is key order except inside runs of keys sharing a head
//     (ordered by hash there; the pager sorts those runs).
//
// lo and hi bound internal_key; each bound also bounds key_head (a key's
// head is a prefix of it), which is what the index uses.
type pageQuery struct {
	groupQuery bool
	group      []byte // the head of the group, for a group query or the range past it
	lo, hi     bound
	reverse    bool
	limit      int
}

func (s statements) page(buf []byte, q pageQuery) []byte {
	buf = append(buf, "SELECT internal_key, value FROM "...)
	buf = append(buf, s.table...)
	n := 0
	// where adds the condition test lit (test ends in its operator).
	where := func(test string, lit []byte) {
		if n == 0 {
			buf = append(buf, " WHERE "...)
		} else {
			buf = append(buf, " AND "...)
		}
		n++
		buf = append(buf, test...)
		buf = appendLit(buf, lit)
	}
	switch {
	case q.groupQuery:
		where("key_head = ", q.group)
	case q.group != nil && !q.reverse:
		where("key_head > ", q.group)
	case q.group != nil && q.reverse:
		where("key_head < ", q.group)
	}
	if q.lo.key != nil {
		if !q.groupQuery {
			where("key_head >= ", sqlkv.KeyHead(q.lo.key))
		}
		if q.lo.inclusive {
			where("internal_key >= ", q.lo.key)
		} else {
			where("internal_key > ", q.lo.key)
		}
	}
	if q.hi.key != nil {
		if !q.groupQuery {
			where("key_head <= ", sqlkv.KeyHead(q.hi.key))
		}
		where("internal_key < ", q.hi.key)
	}
	switch {
	case q.groupQuery && q.reverse:
		buf = append(buf, " ORDER BY internal_key DESC"...)
	case q.groupQuery:
		buf = append(buf, " ORDER BY internal_key"...)
	case q.reverse:
		buf = append(buf, " ORDER BY key_head DESC, key_tail_hash DESC"...)
	default:
		buf = append(buf, " ORDER BY key_head, key_tail_hash"...)
	}
	buf = append(buf, " LIMIT "...)
	return strconv.AppendInt(buf, int64(q.limit), 10)
}
