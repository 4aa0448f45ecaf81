package main

import (
	"fmt"
	"math"
	"strings"
)

// The targets Engram on a SQL database must meet, measured in the same run.
const (
	sqlCreateOfBadger = 0.5 // creates/s at least this fraction of Engram on badger's
	sqlCreateP99      = 500 // ms
)

// writeSQL is the report's section on the SQL stores: a table per database
// with Engram beside kine and Engram on badger, and the targets above.
func (h *harness) writeSQL(b *strings.Builder) {
	ran := map[string]bool{}
	for _, s := range h.ran() {
		ran[s] = true
	}
	chosen := false
	for _, s := range sqlStores {
		chosen = chosen || contains(h.stores, s)
	}
	if !chosen {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("\n## Engram and kine on SQL databases\n\n")
	w("One throwaway server per database on 127.0.0.1, started by the harness for the run and shared by its stores, a fresh database for every store run; the same settings for Engram and kine: %s. ", sqlSettingsNote())
	w("Engram runs its wasm adaptor (`bin/postgres.wasm`, `bin/mysql.wasm`) with its defaults; kine (`bench/kine`, kine's own entry point built from the module proxy) with its own. ")
	w("kine is measured on create only: it accepts only the transaction shapes kube-apiserver sends, so `engram bench`'s preload (transactions of many puts), and every workload built on it, is refused. ")
	w("The load is the one above (%d clients over %d connections, %d-byte random keys, %d-byte values, %s per workload, median of %d repeats). ",
		h.p.clients, h.p.connections, h.p.keySize, h.p.valueSize, h.p.duration, h.p.repeats)
	w("× badger compares with Engram on badger in the same run, × kine with kine on the same database.\n")
	for _, db := range []string{dbPostgres, dbMariaDB} {
		engram, kine := storePostgres, storeKinePostgres
		if db == dbMariaDB {
			engram, kine = storeMySQL, storeKineMySQL
		}
		if !contains(h.stores, engram) && !contains(h.stores, kine) {
			continue
		}
		w("\n### %s", db)
		if v := h.versions[strings.ToLower(db)]; v != "" {
			w(" %s", v)
		}
		w("\n\n")
		for _, s := range []string{engram, kine} {
			if why, skip := h.skipped[s]; skip {
				w("*%s not run: %s.*\n\n", s, why)
			} else if why := h.failed[s]; why != "" {
				w("*%s failed, no further runs against it: %s*\n\n", s, oneLine(why, 400))
			}
		}
		w("| workload | store | throughput | spread | p50 ms | p99 ms | max ms | errors | × badger | × kine |\n")
		w("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, wl := range allWorkloads {
			bd := median(h.results(storeBadger, wl), tput)
			kt := median(h.results(kine, wl), tput)
			for _, s := range []string{engram, kine, storeBadger} {
				rs := h.results(s, wl)
				if !ran[s] || len(rs) == 0 {
					continue
				}
				t := median(rs, tput)
				xb, xk := ratio(t, bd), ratio(t, kt)
				if s == storeBadger {
					xb = ""
				}
				if s == kine {
					xk = ""
				}
				w("| %s | %s | %s %s | %s | %s | %s | %s | %d | %s | %s |\n", wl, s, fnum(t), rs[0].Unit, spread(rs, t),
					fms(median(rs, p50)), fms(median(rs, p99)), fms(median(rs, pmax)), totalErrors(rs), xb, xk)
			}
		}
	}
	w("\n#### Targets\n\n")
	w("| target | required | measured | |\n| --- | --- | --- | --- |\n")
	for _, r := range h.sqlTargets() {
		w("| %s | %s | %s | %s |\n", r.name, r.required, r.measured, metWord(r.ok, r.known))
	}
}

// sqlTargets judges the targets for each database's Engram store.
func (h *harness) sqlTargets() []targetRow {
	var rows []targetRow
	bd := median(h.results(storeBadger, "create"), tput)
	for _, db := range []string{dbPostgres, dbMariaDB} {
		engram, kine := storePostgres, storeKinePostgres
		if db == dbMariaDB {
			engram, kine = storeMySQL, storeKineMySQL
		}
		if !contains(h.stores, engram) {
			continue
		}
		creates := h.results(engram, "create")
		ct, cp := median(creates, tput), median(creates, p99)
		measured := len(creates) > 0
		rows = append(rows,
			targetRow{name: db + ": creates / Engram on badger", required: fmt.Sprintf("≥ %.1f", sqlCreateOfBadger),
				measured: fmt.Sprintf("%s (%s vs %s creates/s)", ratio(ct, bd), fnum(ct), fnum(bd)),
				ok:       ct >= sqlCreateOfBadger*bd, known: measured && !math.IsNaN(bd)},
			targetRow{name: db + ": create p99", required: fmt.Sprintf("≤ %d ms", sqlCreateP99),
				measured: fms(cp) + " ms", ok: cp <= sqlCreateP99, known: measured})
		var errs int64
		n := 0
		for _, wl := range allWorkloads {
			rs := h.results(engram, wl)
			errs += totalErrors(rs)
			n += len(rs)
		}
		measuredErrs := fmt.Sprint(errs)
		if why := h.failed[engram]; why != "" {
			measuredErrs += "; the store failed: " + oneLine(why, 120)
		}
		rows = append(rows, targetRow{name: db + ": errors, every workload", required: "none",
			measured: measuredErrs, ok: errs == 0 && h.failed[engram] == "", known: n > 0})
		kt := median(h.results(kine, "create"), tput)
		rows = append(rows, targetRow{name: db + ": creates / kine's (the floor)", required: "> 1",
			measured: fmt.Sprintf("%s (kine %s creates/s)", ratio(ct, kt), fnum(kt)),
			ok:       ct > kt, known: measured && !math.IsNaN(kt)})
	}
	return rows
}

// totalErrors adds up the repeats' errors.
func totalErrors(rs []resultT) int64 {
	var n int64
	for _, r := range rs {
		n += r.Errors
	}
	return n
}

// metWord is the targets tables' verdict.
func metWord(ok, known bool) string {
	switch {
	case !known:
		return "not measured"
	case ok:
		return "met"
	}
	return "**not met**"
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
