package config

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"reflect"
	"strings"
	"testing"
)

// warnings decodes the JSON log lines WarnUnknownEnv writes.
func warnings(t *testing.T, cfg Config) []map[string]any {
	t.Helper()
	var buf bytes.Buffer
	cfg.WarnUnknownEnv(slog.New(slog.NewJSONHandler(&buf, nil)))
	var out []map[string]any
	for line := range strings.Lines(buf.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// TestUnknownEnvWarns: ENGRAM_* variables that are no key (a wrapper's own,
// a typo) let the configuration load, the known ones still apply, and each
// unknown one gets one warning naming it, as etcd warns about an unknown
// ETCD_* variable.
func TestUnknownEnvWarns(t *testing.T) {
	cleanEnv(t)
	t.Setenv("ENGRAM_BIN", "/usr/local/bin/engram-secret-path")
	t.Setenv("ENGRAM_STORAGE_ENGIN", "memkv")
	t.Setenv("ENGRAM_NAME", "from-env")
	t.Setenv(ConfigEnv, writeFile(t, "log:\n  level: warn\n"))

	cfg, err := load(t)
	if err != nil {
		t.Fatalf("Load with unknown ENGRAM_* variables: %v", err)
	}
	if cfg.Name != "from-env" || cfg.Log.Level != "warn" {
		t.Fatalf("known variable or file not applied: name=%q log.level=%q", cfg.Name, cfg.Log.Level)
	}
	if got, want := cfg.UnknownEnv(), []string{"ENGRAM_BIN", "ENGRAM_STORAGE_ENGIN"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("UnknownEnv() = %q, want %q (ENGRAM_CONFIG and ENGRAM_NAME are known)", got, want)
	}

	lines := warnings(t, cfg)
	if len(lines) != 2 {
		t.Fatalf("want one warning per unknown variable, got %d: %v", len(lines), lines)
	}
	for i, name := range []string{"ENGRAM_BIN", "ENGRAM_STORAGE_ENGIN"} {
		l := lines[i]
		if l["level"] != "WARN" || l["msg"] != "unrecognized environment variable" || l["environment-variable"] != name {
			t.Errorf("warning %d = %v, want level WARN, etcd's message and environment-variable=%s", i, l, name)
		}
	}
	// A typo names the variable meant; an unrelated name suggests nothing.
	if got := lines[1]["did-you-mean"]; got != "ENGRAM_STORAGE_ENGINE" {
		t.Errorf("typo ENGRAM_STORAGE_ENGIN: did-you-mean = %v, want ENGRAM_STORAGE_ENGINE", got)
	}
	if got, ok := lines[0]["did-you-mean"]; ok {
		t.Errorf("ENGRAM_BIN: did-you-mean = %v, want none", got)
	}
	// The value is never logged: a wrapper's variable may hold a secret.
	for _, l := range lines {
		b, _ := json.Marshal(l)
		if strings.Contains(string(b), "secret-path") {
			t.Errorf("warning logs the variable's value: %s", b)
		}
	}
}

// TestUnknownEnvDoesNotExcuseOtherMistakes: with an unknown variable in the
// environment, an unknown file key, an unknown flag and a bad value in a
// known variable still stop the load.
func TestUnknownEnvDoesNotExcuseOtherMistakes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		file  string
		env   map[string]string
		args  []string
		wants []string
	}{
		{name: "unknown file key", file: "storage:\n  engin: memkv\n", wants: []string{"storage.engin", "unknown key", "config file"}},
		{name: "unknown flag", args: []string{"--storage.engin=memkv"}, wants: []string{"storage.engin"}},
		{name: "bad value in a known variable", env: map[string]string{"ENGRAM_WATCH_MAX_LAG": "lots"}, wants: []string{"ENGRAM_WATCH_MAX_LAG", "whole number"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cleanEnv(t)
			t.Setenv("ENGRAM_BIN", "/usr/local/bin/engram")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			args := tc.args
			if tc.file != "" {
				args = append([]string{"--config", writeFile(t, tc.file)}, args...)
			}
			_, err := load(t, args...)
			wantErr(t, err, tc.wants...)
		})
	}
}

// TestNoUnknownEnvNoWarning: a clean environment logs nothing.
func TestNoUnknownEnvNoWarning(t *testing.T) {
	cleanEnv(t)
	t.Setenv("ENGRAM_STORAGE_ENGINE", "memkv")
	cfg := mustLoad(t)
	if lines := warnings(t, cfg); len(lines) != 0 {
		t.Fatalf("want no warning, got %v", lines)
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b  string
		limit int
		want  int
	}{
		{"ENGRAM_NAME", "ENGRAM_NAME", 3, 0},
		{"ENGRAM_NAM", "ENGRAM_NAME", 3, 1},
		{"ENGRAM_NMAE", "ENGRAM_NAME", 3, 2},
		{"ENGRAM_BIN", "ENGRAM_NAME", 3, 3},
		{"", "abcdef", 3, 3},
		{"kitten", "sitting", 10, 3},
	} {
		if got := editDistance(tc.a, tc.b, tc.limit); got != tc.want {
			t.Errorf("editDistance(%q, %q, %d) = %d, want %d", tc.a, tc.b, tc.limit, got, tc.want)
		}
	}
}
