package config

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
)

// cleanEnv removes every ENGRAM_* variable for the duration of the test, so
// the developer's or CI's environment cannot leak into a precedence check.
func cleanEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, EnvPrefix) {
			t.Setenv(name, "") // restores the original value after the test
			os.Unsetenv(name)
		}
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "engram.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func load(t *testing.T, args ...string) (Config, error) {
	t.Helper()
	return Load(args, io.Discard)
}

func mustLoad(t *testing.T, args ...string) Config {
	t.Helper()
	cfg, err := load(t, args...)
	if err != nil {
		t.Fatalf("Load(%q): %v", args, err)
	}
	return cfg
}

func wantErr(t *testing.T, err error, substrs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want an error containing %q, got nil", substrs)
	}
	for _, s := range substrs {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not contain %q", err, s)
		}
	}
}

func TestDefaultsAreValid(t *testing.T) {
	cleanEnv(t)
	d := Default()
	if err := d.Validate(); err != nil {
		t.Fatalf("Default().Validate(): %v", err)
	}
	if got := mustLoad(t); !reflect.DeepEqual(got, d) {
		t.Fatalf("Load() with nothing set:\n got %+v\nwant %+v", got, d)
	}
}

func TestPrecedence(t *testing.T) {
	cleanEnv(t)
	path := writeFile(t, "name: from-file\ndata-dir: /file/dir\nlog:\n  level: warn\n")

	cfg := mustLoad(t, "--config", path)
	if cfg.Name != "from-file" || cfg.DataDir != "/file/dir" || cfg.Log.Level != "warn" {
		t.Fatalf("file layer not applied: %+v", cfg)
	}
	if cfg.Log.Format != "text" {
		t.Fatalf("key absent from file lost its default: log.format=%q", cfg.Log.Format)
	}

	t.Setenv("ENGRAM_NAME", "from-env")
	t.Setenv("ENGRAM_LOG_LEVEL", "error")
	cfg = mustLoad(t, "--config", path)
	if cfg.Name != "from-env" || cfg.Log.Level != "error" {
		t.Fatalf("env did not override file: name=%q level=%q", cfg.Name, cfg.Log.Level)
	}
	if cfg.DataDir != "/file/dir" {
		t.Fatalf("env layer clobbered an unset key: data-dir=%q", cfg.DataDir)
	}

	cfg = mustLoad(t, "--config", path, "--name=from-flag")
	if cfg.Name != "from-flag" {
		t.Fatalf("flag did not override env: name=%q", cfg.Name)
	}
	// A flag left at its default must not undo the file or environment.
	if cfg.Log.Level != "error" || cfg.DataDir != "/file/dir" {
		t.Fatalf("unset flags overrode lower layers: %+v", cfg)
	}
}

func TestConfigFileFromEnv(t *testing.T) {
	cleanEnv(t)
	envFile := writeFile(t, "name: env-file\n")
	flagFile := writeFile(t, "name: flag-file\n")
	t.Setenv(ConfigEnv, envFile)
	if got := mustLoad(t).Name; got != "env-file" {
		t.Fatalf("ENGRAM_CONFIG not read: name=%q", got)
	}
	if got := mustLoad(t, "--config="+flagFile).Name; got != "flag-file" {
		t.Fatalf("--config did not win over ENGRAM_CONFIG: name=%q", got)
	}
}

func TestLists(t *testing.T) {
	cleanEnv(t)
	path := writeFile(t, "listen-client-urls:\n  - http://127.0.0.1:1\n  - http://127.0.0.1:2\n  - http://127.0.0.1:3\n")
	cfg := mustLoad(t, "--config", path)
	if want := []string{"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"}; !reflect.DeepEqual(cfg.ListenClientURLs, want) {
		t.Fatalf("file list: got %q want %q", cfg.ListenClientURLs, want)
	}

	// A higher layer replaces a list; it does not merge entries into it.
	t.Setenv("ENGRAM_LISTEN_CLIENT_URLS", "http://127.0.0.1:4, unix:///tmp/engram.sock")
	cfg = mustLoad(t, "--config", path)
	if want := []string{"http://127.0.0.1:4", "unix:///tmp/engram.sock"}; !reflect.DeepEqual(cfg.ListenClientURLs, want) {
		t.Fatalf("env list: got %q want %q", cfg.ListenClientURLs, want)
	}

	cfg = mustLoad(t, "--config", path, "--listen-client-urls=http://127.0.0.1:5", "--listen-client-urls", "unix:engram.sock")
	if want := []string{"http://127.0.0.1:5", "unix:engram.sock"}; !reflect.DeepEqual(cfg.ListenClientURLs, want) {
		t.Fatalf("flag list: got %q want %q", cfg.ListenClientURLs, want)
	}
}

func TestTypedValues(t *testing.T) {
	cleanEnv(t)
	path := writeFile(t, `
storage:
  engine: memkv
  badger:
    in-memory: true
    gc-interval: -1s
watch:
  progress-notify-interval: 90s
  max-lag: 5000
compaction:
  mode: revision
  revisions: 1000
limits:
  max-request-bytes: 2097152
`)
	t.Setenv("ENGRAM_LIMITS_MAX_TXN_OPS", "256")
	t.Setenv("ENGRAM_COMPACTION_RETENTION", "1h")
	cfg := mustLoad(t, "--config", path, "--shutdown-timeout=2s")
	want := Default()
	want.Storage.Engine = EngineMemKV
	want.Storage.Badger.InMemory = true
	want.Storage.Badger.GCInterval = -1 * time.Second
	want.Watch = Watch{ProgressNotifyInterval: 90 * time.Second, MaxLag: 5000}
	want.Compaction = Compaction{Mode: "revision", Revisions: 1000, Retention: time.Hour}
	want.Limits = Limits{MaxRequestBytes: 2 << 20, MaxTxnOps: 256}
	want.ShutdownTimeout = 2 * time.Second
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("got  %+v\nwant %+v", cfg, want)
	}
}

func TestEmptySectionIsHarmless(t *testing.T) {
	cleanEnv(t)
	path := writeFile(t, "tls:\n#  cert-file: x\nname: n\n")
	if got := mustLoad(t, "--config", path).Name; got != "n" {
		t.Fatalf("name=%q", got)
	}
}

func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		file  string
		env   map[string]string
		args  []string
		wants []string
	}{
		{name: "unknown file key", file: "storage:\n  engin: memkv\n", wants: []string{"storage.engin", "unknown key", "config file"}},
		{name: "unknown flag", args: []string{"--storage.engin=memkv"}, wants: []string{"storage.engin"}},
		{name: "positional argument", args: []string{"extra"}, wants: []string{`unexpected argument "extra"`}},
		{name: "bad int in env", env: map[string]string{"ENGRAM_WATCH_MAX_LAG": "lots"}, wants: []string{"watch.max-lag", "ENGRAM_WATCH_MAX_LAG", "whole number"}},
		{name: "fractional int in file", file: "limits:\n  max-txn-ops: 1.5\n", wants: []string{"limits.max-txn-ops", "whole number"}},
		{name: "bare number duration", file: "watch:\n  progress-notify-interval: 600\n", wants: []string{"watch.progress-notify-interval", "duration with a unit"}},
		{name: "bad duration in env", env: map[string]string{"ENGRAM_SHUTDOWN_TIMEOUT": "soon"}, wants: []string{"shutdown-timeout", "ENGRAM_SHUTDOWN_TIMEOUT", "duration"}},
		{name: "bad bool", env: map[string]string{"ENGRAM_STORAGE_BADGER_IN_MEMORY": "maybe"}, wants: []string{"storage.badger.in-memory", "true or false"}},
		{name: "list of non-strings", file: "listen-client-urls:\n  - {a: 1}\n", wants: []string{"listen-client-urls", "entry 0"}},
		{name: "missing file", args: []string{"--config=/nonexistent/engram.yaml"}, wants: []string{"/nonexistent/engram.yaml"}},
		{name: "broken yaml", file: "name: [\n", wants: []string{"config file"}},
		{name: "unknown engine", args: []string{"--storage.engine=rocks"}, wants: []string{"storage.engine", `"rocks"`}},
		{name: "bad log level", env: map[string]string{"ENGRAM_LOG_LEVEL": "loud"}, wants: []string{"log.level", "loud"}},
		{name: "several validation errors at once", args: []string{"--log.format=xml", "--limits.max-txn-ops=0"}, wants: []string{"log.format", "limits.max-txn-ops"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cleanEnv(t)
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

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*Config)
		wants []string // empty: valid
	}{
		{name: "https and unix with tls", edit: func(c *Config) {
			c.ListenClientURLs = []string{"https://127.0.0.1:2379", "unix:///run/engram.sock"}
			c.TLS = TLS{CertFile: "c", KeyFile: "k", ClientCAFile: "ca"}
		}},
		{name: "mixed http and https without client auth", edit: func(c *Config) {
			c.ListenClientURLs = []string{"http://127.0.0.1:2379", "https://127.0.0.1:2378"}
			c.TLS = TLS{CertFile: "c", KeyFile: "k"}
		}},
		{name: "memkv needs no data dir", edit: func(c *Config) { c.Storage.Engine = EngineMemKV; c.DataDir = "" }},
		{name: "http endpoint disabled", edit: func(c *Config) { c.HTTP.Listen = "" }},
		{name: "periodic compaction", edit: func(c *Config) { c.Compaction = Compaction{Mode: "periodic", Retention: time.Hour} }},
		{name: "watch lag limit disabled", edit: func(c *Config) { c.Watch.MaxLag = -1 }},
		{name: "memory limit disabled", edit: func(c *Config) { c.MemoryLimit = -1 }},
		{name: "memory limit set", edit: func(c *Config) { c.MemoryLimit = 2 << 30 }},
		{name: "memory limit too small", edit: func(c *Config) { c.MemoryLimit = 1 << 20 },
			wants: []string{"memory-limit", "at least 64 MiB"}},
		{name: "tikv with TLS", edit: func(c *Config) {
			c.Storage.Engine = EngineTiKV
			c.DataDir = ""
			c.Storage.TiKV.PDEndpoints = []string{"pd-0:2379", "https://pd-1:2379"}
			c.Storage.TiKV.TLS = TiKVTLS{CAFile: "ca", CertFile: "c", KeyFile: "k"}
		}},
		{name: "tikv without GC", edit: func(c *Config) {
			c.Storage.Engine = EngineTiKV
			c.Storage.TiKV.PDEndpoints = []string{"127.0.0.1:2379"}
			c.Storage.TiKV.GCInterval = 0
		}},

		{name: "tikv without PD", edit: func(c *Config) { c.Storage.Engine = EngineTiKV },
			wants: []string{"storage.tikv.pd-endpoints", "at least one"}},
		{name: "tikv without prefix", edit: func(c *Config) {
			c.Storage.Engine = EngineTiKV
			c.Storage.TiKV.PDEndpoints = []string{"127.0.0.1:2379"}
			c.Storage.TiKV.Prefix = ""
		}, wants: []string{"storage.tikv.prefix"}},
		{name: "tikv bad endpoint", edit: func(c *Config) { c.Storage.TiKV.PDEndpoints = []string{"pd"} },
			wants: []string{"storage.tikv.pd-endpoints", "host:port"}},
		{name: "tikv prefix without end", edit: func(c *Config) { c.Storage.TiKV.Prefix = "\xff\xff" },
			wants: []string{"storage.tikv.prefix", "0xFF"}},
		{name: "tikv cert without CA", edit: func(c *Config) { c.Storage.TiKV.TLS = TiKVTLS{CertFile: "c", KeyFile: "k"} },
			wants: []string{"storage.tikv.tls.ca-file"}},
		{name: "tikv cert without key", edit: func(c *Config) { c.Storage.TiKV.TLS = TiKVTLS{CAFile: "ca", CertFile: "c"} },
			wants: []string{"storage.tikv.tls.cert-file"}},
		{name: "tikv short GC life time", edit: func(c *Config) { c.Storage.TiKV.GCLifeTime = time.Second },
			wants: []string{"storage.tikv.gc-life-time"}},
		{name: "tikv zero timeouts", edit: func(c *Config) { c.Storage.TiKV.DialTimeout, c.Storage.TiKV.RequestTimeout = 0, 0 },
			wants: []string{"storage.tikv.dial-timeout", "storage.tikv.request-timeout"}},

		{name: "https without cert", edit: func(c *Config) { c.ListenClientURLs = []string{"https://127.0.0.1:2379"} },
			wants: []string{"listen-client-urls", "tls.cert-file"}},
		{name: "cert without key", edit: func(c *Config) {
			c.ListenClientURLs = []string{"https://127.0.0.1:2379"}
			c.TLS.CertFile = "c"
		}, wants: []string{"tls.cert-file and tls.key-file must be set together"}},
		{name: "client ca without cert", edit: func(c *Config) { c.TLS.ClientCAFile = "ca" }, wants: []string{"tls.client-ca-file"}},
		{name: "client ca with plaintext listener", edit: func(c *Config) {
			c.ListenClientURLs = []string{"https://127.0.0.1:2379", "http://127.0.0.1:2380"}
			c.TLS = TLS{CertFile: "c", KeyFile: "k", ClientCAFile: "ca"}
		}, wants: []string{"http://127.0.0.1:2380", "bypass"}},
		{name: "tls without https listener", edit: func(c *Config) { c.TLS = TLS{CertFile: "c", KeyFile: "k"} },
			wants: []string{"tls.cert-file", "no listen-client-urls entry uses https://"}},
		{name: "no listen urls", edit: func(c *Config) { c.ListenClientURLs = nil }, wants: []string{"listen-client-urls", "at least one"}},
		{name: "bad scheme", edit: func(c *Config) { c.ListenClientURLs = []string{"grpc://127.0.0.1:2379"} }, wants: []string{"unsupported scheme"}},
		{name: "no port", edit: func(c *Config) { c.ListenClientURLs = []string{"http://127.0.0.1"} }, wants: []string{"listen-client-urls", "host:port"}},
		{name: "path after port", edit: func(c *Config) { c.ListenClientURLs = []string{"http://127.0.0.1:2379/v3"} }, wants: []string{"nothing after the port"}},
		{name: "bad advertise", edit: func(c *Config) { c.AdvertiseClientURLs = []string{"ftp://x:1"} }, wants: []string{"advertise-client-urls"}},
		{name: "empty name", edit: func(c *Config) { c.Name = " " }, wants: []string{"name"}},
		{name: "badger needs data dir", edit: func(c *Config) { c.DataDir = "" }, wants: []string{"data-dir"}},
		{name: "bad http listen", edit: func(c *Config) { c.HTTP.Listen = "localhost" }, wants: []string{"http.listen"}},
		{name: "zero progress interval", edit: func(c *Config) { c.Watch.ProgressNotifyInterval = 0 }, wants: []string{"watch.progress-notify-interval"}},
		{name: "negative compaction interval", edit: func(c *Config) { c.Compaction.Interval = -time.Second }, wants: []string{"compaction.interval"}},
		{name: "periodic without retention", edit: func(c *Config) { c.Compaction.Mode = "periodic" }, wants: []string{"compaction.retention"}},
		{name: "revision without revisions", edit: func(c *Config) { c.Compaction.Mode = "revision" }, wants: []string{"compaction.revisions"}},
		{name: "unknown compaction mode", edit: func(c *Config) { c.Compaction.Mode = "hourly" }, wants: []string{"compaction.mode", "hourly"}},
		{name: "negative block cache", edit: func(c *Config) { c.Storage.Badger.BlockCacheSize = -1 }, wants: []string{"storage.badger.block-cache-size"}},
		{name: "pebble needs data dir", edit: func(c *Config) { c.Storage.Engine, c.DataDir = EnginePebble, "" }, wants: []string{"data-dir", "pebble"}},
		{name: "tiny pebble sizes", edit: func(c *Config) {
			c.Storage.Engine, c.Storage.Pebble = EnginePebble, Pebble{CacheSize: 1024, MemTableSize: 0, Compression: "lz4"}
		}, wants: []string{"storage.pebble.cache-size", "storage.pebble.memtable-size", "storage.pebble.compression"}},
		{name: "pebble sizes ignored by badger", edit: func(c *Config) { c.Storage.Pebble = Pebble{} }},
		{name: "pebble in a cluster", edit: func(c *Config) {
			c.Storage.Engine, c.Cluster.Enabled = EnginePebble, true
			c.AdvertiseClientURLs = []string{"http://127.0.0.1:2379"}
		}, wants: []string{"cluster.enabled", "pebble"}},
		{name: "zero request bytes", edit: func(c *Config) { c.Limits.MaxRequestBytes = 0 }, wants: []string{"limits.max-request-bytes"}},
		{name: "zero shutdown timeout", edit: func(c *Config) { c.ShutdownTimeout = 0 }, wants: []string{"shutdown-timeout"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.edit(&c)
			err := c.Validate()
			if len(tc.wants) == 0 {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			wantErr(t, err, tc.wants...)
		})
	}
}

func TestParseClientURL(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want ClientURL
		err  bool
	}{
		{in: "http://127.0.0.1:2379", want: ClientURL{"http", "127.0.0.1:2379"}},
		{in: "https://[::1]:2379", want: ClientURL{"https", "[::1]:2379"}},
		{in: "http://localhost:0/", want: ClientURL{"http", "localhost:0"}},
		{in: "unix:///run/engram.sock", want: ClientURL{"unix", "/run/engram.sock"}},
		{in: "unix:/run/engram.sock", want: ClientURL{"unix", "/run/engram.sock"}},
		{in: "unix:engram.sock", want: ClientURL{"unix", "engram.sock"}},
		{in: "unix://engram.sock", want: ClientURL{"unix", "engram.sock"}},
		{in: "unix:", err: true},
		{in: "unix://", err: true},
		{in: "127.0.0.1:2379", err: true},
		{in: "http://127.0.0.1:99999", err: true},
		{in: "http://user@127.0.0.1:1", err: true},
	} {
		got, err := ParseClientURL(tc.in)
		if tc.err {
			if err == nil {
				t.Errorf("ParseClientURL(%q) = %+v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseClientURL(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestHelp(t *testing.T) {
	cleanEnv(t)
	var out strings.Builder
	_, err := Load([]string{"--help"}, &out)
	if !errors.Is(err, ErrHelp) {
		t.Fatalf("want ErrHelp, got %v", err)
	}
	for _, ki := range allKeys {
		if !strings.Contains(out.String(), "--"+ki.name) {
			t.Errorf("usage lacks --%s", ki.name)
		}
		if ki.help == "" {
			t.Errorf("key %s has no help tag", ki.name)
		}
	}
}

// TestExampleFileMatchesDefaults keeps config.example.yaml, the documented
// list of keys, in step with Config: it must name every key, only known
// keys, each set to its default.
func TestExampleFileMatchesDefaults(t *testing.T) {
	cleanEnv(t)
	const path = "../../../../config.example.yaml"
	k := koanf.New(".")
	if err := k.Load(file.Provider(path), yaml.Parser()); err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	for _, ki := range allKeys {
		if !k.Exists(ki.name) {
			t.Errorf("%s does not list key %s", path, ki.name)
		}
	}
	cfg, err := Load([]string{"--config", path}, io.Discard)
	if err != nil {
		t.Fatalf("Load(example): %v", err)
	}
	if d := Default(); !reflect.DeepEqual(cfg, d) {
		t.Fatalf("%s does not hold the defaults:\n got %+v\nwant %+v", path, cfg, d)
	}
}

func TestEnvNames(t *testing.T) {
	for name, want := range map[string]string{
		"storage.engine":                 "ENGRAM_STORAGE_ENGINE",
		"listen-client-urls":             "ENGRAM_LISTEN_CLIENT_URLS",
		"watch.progress-notify-interval": "ENGRAM_WATCH_PROGRESS_NOTIFY_INTERVAL",
		"tls.client-ca-file":             "ENGRAM_TLS_CLIENT_CA_FILE",
	} {
		if got := byName[name].env; got != want {
			t.Errorf("env for %s = %q, want %q", name, got, want)
		}
	}
}
