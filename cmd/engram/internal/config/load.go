package config

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/env"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
)

// EnvPrefix starts every environment variable the loader reads.
const EnvPrefix = "ENGRAM_"

// ConfigEnv names the YAML file to load when --config is not given.
const ConfigEnv = EnvPrefix + "CONFIG"

// ErrHelp is returned by Load after it printed the usage for -h/--help.
var ErrHelp = pflag.ErrHelp

// Load builds the configuration of `engram serve` from its arguments (the
// ones after the subcommand), the process environment and the YAML file they
// name, then validates it. Usage text for --help goes to out. Errors name the
// offending key and where its value came from.
func Load(args []string, out io.Writer) (Config, error) {
	cfg, _, err := LoadCommand(args, out, nil)
	return cfg, err
}

// Command describes a subcommand that opens the same store as `engram
// serve` (snapshot restore, migrate): its usage line, its own flags, and
// how many positional arguments it takes.
type Command struct {
	// Usage is the first lines of --help, before the flags.
	Usage string
	// Flags adds the command's own flags; they are not configuration keys.
	Flags func(fs *pflag.FlagSet)
	// Args is the exact number of positional arguments.
	Args int
}

// LoadCommand is Load for a subcommand: the configuration keys as flags,
// environment and file exactly as for serve, plus the command's own flags
// (parsed into whatever Flags bound them to) and its positional arguments.
func LoadCommand(args []string, out io.Writer, cmd *Command) (Config, []string, error) {
	fs := newFlagSet()
	own := map[string]bool{}
	if cmd != nil && cmd.Flags != nil {
		before := map[string]bool{}
		fs.VisitAll(func(f *pflag.Flag) { before[f.Name] = true })
		cmd.Flags(fs)
		fs.VisitAll(func(f *pflag.Flag) {
			if !before[f.Name] {
				own[f.Name] = true
			}
		})
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			if cmd != nil {
				fmt.Fprintf(out, "%s\nFlags (the command's own, then every key of `engram serve`, which name the store):\n%s", cmd.Usage, fs.FlagUsages())
			} else {
				writeUsage(out, fs)
			}
			return Config{}, nil, ErrHelp
		}
		return Config{}, nil, fmt.Errorf("command line: %w", err)
	}
	wantArgs := 0
	if cmd != nil {
		wantArgs = cmd.Args
	}
	if fs.NArg() > wantArgs {
		return Config{}, nil, fmt.Errorf("command line: unexpected argument %q (settings are flags: --key=value)", fs.Arg(wantArgs))
	}
	if fs.NArg() < wantArgs {
		return Config{}, nil, fmt.Errorf("command line: want %d argument(s), got %d", wantArgs, fs.NArg())
	}
	cfg, err := loadLayers(fs, own)
	return cfg, fs.Args(), err
}

// loadLayers merges defaults, the file, the environment and the flags set
// on the command line (except the command's own), and validates the result.
func loadLayers(fs *pflag.FlagSet, own map[string]bool) (Config, error) {

	k := koanf.New(".")
	def := Default()
	for _, ki := range allKeys {
		if err := k.Set(ki.name, ki.get(&def)); err != nil {
			return Config{}, fmt.Errorf("defaults: %s: %w", ki.name, err)
		}
	}

	path, _ := fs.GetString("config")
	if path == "" {
		path = os.Getenv(ConfigEnv)
	}
	if path != "" {
		layer := koanf.New(".")
		if err := layer.Load(file.Provider(path), yaml.Parser()); err != nil {
			return Config{}, fmt.Errorf("config file %s: %w", path, err)
		}
		if err := checkLayer(layer, func(key string) string { return "in config file " + path }); err != nil {
			return Config{}, err
		}
		if err := k.Merge(layer); err != nil {
			return Config{}, fmt.Errorf("config file %s: %w", path, err)
		}
	}

	var unknownEnv []string
	envLayer := koanf.New(".")
	err := envLayer.Load(env.ProviderWithValue(EnvPrefix, ".", func(name, value string) (string, any) {
		if name == ConfigEnv {
			return "", nil
		}
		ki, ok := byEnv[name]
		if !ok {
			unknownEnv = append(unknownEnv, name)
			return "", nil
		}
		if ki.typ == reflect.TypeFor[[]string]() {
			// A list in one variable: comma-separated, as etcd's
			// ETCD_LISTEN_CLIENT_URLS.
			return ki.name, splitList(value)
		}
		return ki.name, value
	}), nil)
	if err != nil {
		return Config{}, fmt.Errorf("environment: %w", err)
	}
	// Unknown variables are only reported (Config.WarnUnknownEnv), as etcd
	// warns about an unknown ETCD_* one: wrappers and tools export their own
	// ENGRAM_* names (env.go).
	slices.Sort(unknownEnv)
	if err := checkLayer(envLayer, func(key string) string { return "from environment variable " + byName[key].env }); err != nil {
		return Config{}, err
	}
	if err := k.Merge(envLayer); err != nil {
		return Config{}, fmt.Errorf("environment: %w", err)
	}

	// Only flags given on the command line are merged: k already holds every
	// key, so posflag skips unchanged flags instead of applying their
	// defaults over the file and environment.
	flagLayer := koanf.New(".")
	if err := flagLayer.Load(posflag.ProviderWithFlag(fs, ".", k, func(f *pflag.Flag) (string, any) {
		if f.Name == "config" || own[f.Name] {
			return "", nil
		}
		return f.Name, posflag.FlagVal(fs, f)
	}), nil); err != nil {
		return Config{}, fmt.Errorf("command line: %w", err)
	}
	if err := checkLayer(flagLayer, func(key string) string { return "from flag --" + key }); err != nil {
		return Config{}, err
	}
	if err := k.Merge(flagLayer); err != nil {
		return Config{}, fmt.Errorf("command line: %w", err)
	}

	var cfg Config
	if err := decode(k, &cfg, func(string) string { return "" }); err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("invalid configuration:\n%w", err)
	}
	cfg.unknownEnv = unknownEnv
	return cfg, nil
}

// Usage writes the help text of `engram serve` to out.
func Usage(out io.Writer) {
	writeUsage(out, newFlagSet())
}

func writeUsage(out io.Writer, fs *pflag.FlagSet) {
	fmt.Fprintf(out, `Usage: engram [serve] [flags]

Runs the Engram server. Settings are layered: built-in defaults, then the
YAML file given by --config (or %s), then %s* environment variables
(the key in upper case with dots and dashes as underscores, e.g.
%sSTORAGE_ENGINE=memkv; lists comma-separated), then flags.
config.example.yaml documents every key.

Flags:
%s`, ConfigEnv, EnvPrefix, EnvPrefix, fs.FlagUsages())
}

// newFlagSet declares one flag per key, named as the key. It prints
// nothing itself: Load reports parse errors in its own words and writes the
// usage only for --help.
func newFlagSet() *pflag.FlagSet {
	fs := pflag.NewFlagSet("engram serve", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.String("config", "", "YAML configuration file (also "+ConfigEnv+")")
	def := Default()
	for _, ki := range allKeys {
		v := ki.get(&def)
		switch d := v.(type) {
		case string:
			fs.String(ki.name, d, ki.help)
		case []string:
			fs.StringSlice(ki.name, d, ki.help)
		case bool:
			fs.Bool(ki.name, d, ki.help)
		case int:
			fs.Int(ki.name, d, ki.help)
		case int64:
			fs.Int64(ki.name, d, ki.help)
		case time.Duration:
			fs.Duration(ki.name, d, ki.help)
		default:
			// Reached only if a field of a new type is added to Config
			// without teaching the loader about it; the unit tests load
			// every key, so this cannot ship.
			panic(fmt.Sprintf("config: key %s has unsupported type %T", ki.name, v))
		}
	}
	return fs
}

// keyInfo describes one configuration key, derived from a Config field.
type keyInfo struct {
	name  string // dotted koanf key, e.g. "storage.engine"
	env   string // environment variable, e.g. "ENGRAM_STORAGE_ENGINE"
	help  string
	typ   reflect.Type
	index []int // field path for reflect.Value.FieldByIndex
}

func (ki keyInfo) get(c *Config) any {
	return reflect.ValueOf(c).Elem().FieldByIndex(ki.index).Interface()
}

// allKeys, byName and byEnv are immutable tables computed from the Config
// type once; they hold no state that changes at run time.
var (
	allKeys = collectKeys(reflect.TypeFor[Config](), "", nil)
	byName  = indexKeys(func(ki keyInfo) string { return ki.name })
	byEnv   = indexKeys(func(ki keyInfo) string { return ki.env })
)

func collectKeys(t reflect.Type, prefix string, index []int) []keyInfo {
	var out []keyInfo
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("koanf")
		if tag == "" {
			continue
		}
		name := prefix + tag
		idx := append(slices.Clone(index), i)
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Duration]() {
			out = append(out, collectKeys(f.Type, name+".", idx)...)
			continue
		}
		out = append(out, keyInfo{
			name:  name,
			env:   EnvPrefix + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(name)),
			help:  f.Tag.Get("help"),
			typ:   f.Type,
			index: idx,
		})
	}
	return out
}

func indexKeys(by func(keyInfo) string) map[string]keyInfo {
	m := make(map[string]keyInfo, len(allKeys))
	for _, ki := range allKeys {
		if _, dup := m[by(ki)]; dup {
			panic("config: two keys map to " + by(ki))
		}
		m[by(ki)] = ki
	}
	return m
}

// isGroup reports whether name is the prefix of some keys (e.g. "storage").
func isGroup(name string) bool {
	for _, ki := range allKeys {
		if strings.HasPrefix(ki.name, name+".") {
			return true
		}
	}
	return false
}

// checkLayer refuses unknown keys and values of the wrong type in one layer,
// so the error can say where the bad value came from.
func checkLayer(layer *koanf.Koanf, where func(key string) string) error {
	var errs []error
	for _, key := range layer.Keys() {
		if _, ok := byName[key]; ok {
			continue
		}
		// An empty YAML section ("tls:" with every entry commented out)
		// reads as a nil group; that is harmless.
		if isGroup(key) && layer.Get(key) == nil {
			continue
		}
		errs = append(errs, fmt.Errorf("%s: unknown key %s", key, where(key)))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	var scratch Config
	return decode(layer, &scratch, where)
}

// decode copies every key present in k into dst, converting its type.
func decode(k *koanf.Koanf, dst *Config, where func(key string) string) error {
	var errs []error
	root := reflect.ValueOf(dst).Elem()
	for _, ki := range allKeys {
		if !k.Exists(ki.name) {
			continue
		}
		v, err := convert(k.Get(ki.name), ki.typ)
		if err != nil {
			w := where(ki.name)
			if w != "" {
				w = " (" + w + ")"
			}
			errs = append(errs, fmt.Errorf("%s%s: %w", ki.name, w, err))
			continue
		}
		root.FieldByIndex(ki.index).Set(v)
	}
	return errors.Join(errs...)
}

// valueOrString converts raw, a T already or a string that parse reads,
// to a T; anything else is an error: want, and what raw is.
func valueOrString[T any](raw any, parse func(string) (T, error), want string) (reflect.Value, error) {
	switch v := raw.(type) {
	case T:
		return reflect.ValueOf(v), nil
	case string:
		t, err := parse(v)
		if err != nil {
			return reflect.Value{}, err
		}
		return reflect.ValueOf(t), nil
	default:
		return reflect.Value{}, fmt.Errorf("%s, got %v", want, raw)
	}
}

func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("want a duration such as 500ms, 30s or 10m: %w", err)
	}
	return d, nil
}

func parseBool(s string) (bool, error) {
	b, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return false, fmt.Errorf("want true or false, got %q", s)
	}
	return b, nil
}

// convert turns a raw value from YAML, the environment (always a string) or
// a flag into typ. It is stricter than a generic decoder where leniency
// hides mistakes: a bare number is not a duration (is 30 seconds or
// nanoseconds meant?), and integers must be whole and in range.
func convert(raw any, typ reflect.Type) (reflect.Value, error) {
	if raw == nil {
		return reflect.Zero(typ), nil
	}
	switch typ {
	case reflect.TypeFor[time.Duration]():
		return valueOrString(raw, parseDuration, "want a duration with a unit such as 30s or 10m")
	case reflect.TypeFor[[]string]():
		var out []string
		switch v := raw.(type) {
		case []string:
			out = slices.Clone(v)
		case string:
			out = splitList(v)
		case []any:
			for i, e := range v {
				s, ok := e.(string)
				if !ok {
					return reflect.Value{}, fmt.Errorf("entry %d: want a string, got %v", i, e)
				}
				out = append(out, s)
			}
		default:
			return reflect.Value{}, fmt.Errorf("want a list of strings, got %v", raw)
		}
		if len(out) == 0 {
			// One spelling of "no entries", whichever layer said it.
			return reflect.Zero(typ), nil
		}
		return reflect.ValueOf(out), nil
	}
	switch typ.Kind() {
	case reflect.String:
		switch v := raw.(type) {
		case string:
			return reflect.ValueOf(v).Convert(typ), nil
		case int, int64, uint64, float64:
			// YAML reads `name: 1` as a number; a name is still meant.
			return reflect.ValueOf(fmt.Sprint(v)).Convert(typ), nil
		default:
			return reflect.Value{}, fmt.Errorf("want a string, got %v", raw)
		}
	case reflect.Bool:
		return valueOrString(raw, parseBool, "want true or false")
	case reflect.Int, reflect.Int64:
		n, err := toInt64(raw)
		if err != nil {
			return reflect.Value{}, err
		}
		if typ.Kind() == reflect.Int && (n > math.MaxInt || n < math.MinInt) {
			return reflect.Value{}, fmt.Errorf("%d is out of range", n)
		}
		return reflect.ValueOf(n).Convert(typ), nil
	}
	return reflect.Value{}, fmt.Errorf("unsupported type %s", typ)
}

func toInt64(raw any) (int64, error) {
	switch v := raw.(type) {
	case int:
		return int64(v), nil
	case int64:
		return v, nil
	case uint64:
		if v > math.MaxInt64 {
			return 0, fmt.Errorf("%d is out of range", v)
		}
		return int64(v), nil
	case float64:
		if v != math.Trunc(v) || v > math.MaxInt64 || v < math.MinInt64 {
			return 0, fmt.Errorf("want a whole number, got %v", v)
		}
		return int64(v), nil
	case string:
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("want a whole number, got %q", v)
		}
		return n, nil
	default:
		return 0, fmt.Errorf("want a whole number, got %v", raw)
	}
}

// splitList reads a comma-separated list, ignoring blanks around entries and
// empty entries, so "a, b," is [a b] and "" is the empty list.
func splitList(s string) []string {
	out := []string{}
	for part := range strings.SplitSeq(s, ",") {
		if p := strings.TrimSpace(part); p != "" {
			out = append(out, p)
		}
	}
	return out
}
