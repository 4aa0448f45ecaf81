package config

import (
	"log/slog"
	"slices"
)

// Unknown ENGRAM_* environment variables.
//
// An ENGRAM_* variable that names no key does not stop the start: it is
// reported once the logger exists, one warning per variable, as etcd warns
// about an unrecognized ETCD_* variable and starts (etcd 3.6:
// pkg/flags/flag.go, verifyEnv). Wrapper scripts and tools export names of
// their own under the prefix (a wrapper's ENGRAM_BIN, the test tooling's
// ENGRAM_ETCD_BIN_DIR or ENGRAM_DIFF_*), and refusing to start over them
// broke such setups. Unknown keys in a config file and unknown flags still
// fail: those are written for Engram alone, so an unknown one is a mistake.
//
// The warning names the variable but not its value, unlike etcd's, which
// logs NAME=value: a wrapper's variable may hold a secret. A name that is
// one or two edits away from a key's variable also names that variable, so
// a typo that no longer fails is still easy to see.

// UnknownEnv returns the ENGRAM_* environment variables, sorted, that
// named no key when the configuration was loaded.
func (c Config) UnknownEnv() []string { return slices.Clone(c.unknownEnv) }

// WarnUnknownEnv logs one warning for each ENGRAM_* environment variable
// that named no key. The binary calls it once its logger exists, which the
// configuration itself sets up.
func (c Config) WarnUnknownEnv(log *slog.Logger) {
	for _, name := range c.unknownEnv {
		attrs := []any{"environment-variable", name, "hint", "not a configuration key, ignored; see config.example.yaml (" + EnvPrefix + "<KEY>, dots and dashes as underscores)"}
		if near := nearestEnv(name); near != "" {
			attrs = append(attrs, "did-you-mean", near)
		}
		log.Warn("unrecognized environment variable", attrs...)
	}
}

// nearestEnv returns the key variable closest to name when it is at most
// two edits away (a typo), else "".
func nearestEnv(name string) string {
	best, bestD := "", 3
	for _, ki := range allKeys {
		if d := editDistance(name, ki.env, bestD); d < bestD {
			best, bestD = ki.env, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b, or limit when it is
// at least limit (the rows stop early then).
func editDistance(a, b string, limit int) int {
	if d := len(a) - len(b); d >= limit || -d >= limit {
		return limit
	}
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		rowMin := cur[0]
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			rowMin = min(rowMin, cur[j])
		}
		if rowMin >= limit {
			return limit
		}
		prev, cur = cur, prev
	}
	return min(prev[len(b)], limit)
}
