package main

import (
	"fmt"
	"strings"

	"github.com/engramkv/engram/wasm/adaptors/internal/sqlkv"
)

// headLen is how many leading key bytes the ordering index holds; see
// sqlkv.HeadLen and schema.
const headLen = sqlkv.HeadLen

// schema creates the table. Every key is stored whole in internal_key, as
// KubeBrain's SQL mapping lays it out; the primary key is over two columns PostgreSQL
// derives from it:
//
//   - key_head, the first headLen bytes, which orders rows: bytea compares
//     bytewise like bytes.Compare (memcmp, then the shorter first, with no
//     collation), and a key's head never sorts after the key's successors'
//     heads, so ORDER BY key_head, internal_key is ORDER BY internal_key
//     served by the index (PostgreSQL sorts only the rare rows that share a
//     head);
//   - key_tail_hash, the SHA-256 of the bytes past the head (empty for the
//     usual short key), which makes long keys unique.
//
// Generated columns keep the derivation in one place (the database), so
// rows written by hand through SQL are found too.
const schema = `CREATE TABLE %[1]s (
	internal_key  bytea NOT NULL,
	value         bytea NOT NULL,
	key_head      bytea GENERATED ALWAYS AS (substring(internal_key FROM 1 FOR %[2]d)) STORED,
	key_tail_hash bytea GENERATED ALWAYS AS (CASE WHEN octet_length(internal_key) > %[2]d
		THEN sha256(substring(internal_key FROM %[3]d)) ELSE ''::bytea END) STORED,
	PRIMARY KEY (key_head, key_tail_hash)
)`

// statements are the SQL texts of one table, built once at INIT. pgx
// prepares each text on first use per connection and caches it.
type statements struct {
	create string
	probe  string
	get    string
	put    string
	putNew string
	cas    string
	cad    string
	del    string
	// The multi-row forms of the writes (queueMany in commit.go): each
	// takes arrays (unnest) and handles every op of its kind in a batch in
	// one statement; the conditional ones return the keys whose condition
	// held.
	putMany    string
	putNewMany string
	casMany    string
	cadMany    string
	delMany    string
	// pages[reverse][lower][upper] is a page query; see pageSQL.
	pages [2][3][2]string
	// size and vacuum answer SIZE and RECLAIM (space.go).
	size   string
	vacuum string
}

// Lower bounds of a page query.
const (
	lowerNone      = iota // from the first key
	lowerInclusive        // internal_key >= $1 (the scan's start)
	lowerExclusive        // internal_key > $1 (after the last key of a forward page)
)

func newStatements(table string) *statements {
	// match is the primary-key lookup of the key in $1, spelled with the
	// generated columns' expressions so the index is used.
	match := fmt.Sprintf(`key_head = substring($1::bytea FROM 1 FOR %[1]d) AND key_tail_hash = (CASE WHEN octet_length($1::bytea) > %[1]d
		THEN sha256(substring($1::bytea FROM %[2]d)) ELSE ''::bytea END)`, headLen, headLen+1)
	s := &statements{
		create: fmt.Sprintf(schema, table, headLen, headLen+1),
		probe:  fmt.Sprintf(`SELECT internal_key, value, key_head, key_tail_hash FROM %s LIMIT 0`, table),
		get:    fmt.Sprintf(`SELECT value FROM %s WHERE %s`, table, match),
		put: fmt.Sprintf(`INSERT INTO %s (internal_key, value) VALUES ($1, $2)
			ON CONFLICT (key_head, key_tail_hash) DO UPDATE SET value = EXCLUDED.value`, table),
		putNew: fmt.Sprintf(`INSERT INTO %s (internal_key, value) VALUES ($1, $2)
			ON CONFLICT (key_head, key_tail_hash) DO NOTHING`, table),
		cas: fmt.Sprintf(`UPDATE %s SET value = $2 WHERE %s AND value = $3`, table, match),
		cad: fmt.Sprintf(`DELETE FROM %s WHERE %s AND value = $2`, table, match),
		del: fmt.Sprintf(`DELETE FROM %s WHERE %s`, table, match),
		// The table's heap, its TOAST table (the values over 2 kB) and
		// every index, as they take space on disk. $1 is the table's
		// quoted name.
		size: `SELECT pg_total_relation_size($1::regclass)`,
		// Plain VACUUM, not VACUUM FULL: it marks the space of deleted
		// rows reusable and truncates empty pages at the table's end,
		// under a lock that lets reads and writes go on, where FULL
		// rewrites the table under an ACCESS EXCLUSIVE lock that would
		// hold every commit (and read) until it ends.
		vacuum: fmt.Sprintf(`VACUUM %s`, table),
	}
	// umatch is match for the key column k of the unnested arrays u.
	umatch := fmt.Sprintf(`t.key_head = substring(u.k FROM 1 FOR %[1]d) AND t.key_tail_hash = (CASE WHEN octet_length(u.k) > %[1]d
		THEN sha256(substring(u.k FROM %[2]d)) ELSE ''::bytea END)`, headLen, headLen+1)
	s.putMany = fmt.Sprintf(`INSERT INTO %s (internal_key, value) SELECT k, v FROM unnest($1::bytea[], $2::bytea[]) AS u(k, v)
			ON CONFLICT (key_head, key_tail_hash) DO UPDATE SET value = EXCLUDED.value`, table)
	s.putNewMany = fmt.Sprintf(`INSERT INTO %s (internal_key, value) SELECT k, v FROM unnest($1::bytea[], $2::bytea[]) AS u(k, v)
			ON CONFLICT (key_head, key_tail_hash) DO NOTHING RETURNING internal_key`, table)
	s.casMany = fmt.Sprintf(`UPDATE %s AS t SET value = u.v FROM unnest($1::bytea[], $2::bytea[], $3::bytea[]) AS u(k, v, e)
			WHERE %s AND t.value = u.e RETURNING t.internal_key`, table, umatch)
	s.cadMany = fmt.Sprintf(`DELETE FROM %s AS t USING unnest($1::bytea[], $2::bytea[]) AS u(k, e)
			WHERE %s AND t.value = u.e RETURNING t.internal_key`, table, umatch)
	s.delMany = fmt.Sprintf(`DELETE FROM %s AS t USING unnest($1::bytea[]) AS u(k) WHERE %s`, table, umatch)
	for rev := range 2 {
		for lower := range 3 {
			for upper := range 2 {
				s.pages[rev][lower][upper] = pageSQL(table, rev == 1, lower, upper == 1)
			}
		}
	}
	return s
}

// pageSQL is one page of a scan. Its parameters are, in order: the lower
// bound (if any), the exclusive upper bound (if any), the row limit. Each
// bound on internal_key is paired with the same bound on key_head (implied
// by it, since a key's head is a prefix of the key), which the index uses.
func pageSQL(table string, reverse bool, lower int, upper bool) string {
	var conds []string
	n := 0
	param := func() string {
		n++
		return fmt.Sprintf("$%d::bytea", n)
	}
	switch lower {
	case lowerInclusive:
		p := param()
		conds = append(conds, fmt.Sprintf(`key_head >= substring(%s FROM 1 FOR %d) AND internal_key >= %s`, p, headLen, p))
	case lowerExclusive:
		p := param()
		conds = append(conds, fmt.Sprintf(`key_head >= substring(%s FROM 1 FOR %d) AND internal_key > %s`, p, headLen, p))
	}
	if upper {
		p := param()
		conds = append(conds, fmt.Sprintf(`key_head <= substring(%s FROM 1 FOR %d) AND internal_key < %s`, p, headLen, p))
	}
	where := ""
	if len(conds) > 0 {
		where = " WHERE " + strings.Join(conds, " AND ")
	}
	order := "key_head, internal_key"
	if reverse {
		order = "key_head DESC, internal_key DESC"
	}
	return fmt.Sprintf(`SELECT internal_key, value FROM %s%s ORDER BY %s LIMIT $%d`, table, where, order, n+1)
}
