package linearizability

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// The runs' knobs, from the environment (make soak sets them):
//
//	ENGRAM_LIN_DURATION  how long each run's load lasts (default 20s)
//	ENGRAM_LIN_SEED      the operations' seed (default: the clock; printed)
//	ENGRAM_LIN_SOAK      set: also run the variants kept out of make test
//	E2E_ENGRAM_BINARY    an engram binary to run instead of building one
//	ENGRAM_LIN_ARTIFACTS where a failed run leaves its history and
//	                     porcupine's visualization (default a new directory
//	                     under os.TempDir); when set, passing runs leave
//	                     their history there too
//	ENGRAM_LIN_LOG       debug|info|warn: the in-process nodes' logs
//	ENGRAM_LIN_TRACE     set: the in-process nodes print every unary
//	                     request with its answer (to follow one operation
//	                     through forwarding)
const defaultDuration = 20 * time.Second

var binary struct {
	once sync.Once
	path string
	err  error
	dir  string
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binary.dir != "" {
		_ = os.RemoveAll(binary.dir)
	}
	os.Exit(code)
}

// engramBinary builds cmd/engram once per test process (the process runs
// use the binary that ships), or returns E2E_ENGRAM_BINARY.
func engramBinary(t *testing.T) string {
	t.Helper()
	binary.once.Do(func() {
		if p := os.Getenv("E2E_ENGRAM_BINARY"); p != "" {
			binary.path = p
			return
		}
		binary.dir, binary.err = os.MkdirTemp("", "engram-lin-bin-")
		if binary.err != nil {
			return
		}
		binary.path = filepath.Join(binary.dir, "engram")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", binary.path, "github.com/engramkv/engram/cmd/engram")
		if out, err := cmd.CombinedOutput(); err != nil {
			binary.err = fmt.Errorf("building engram: %v\n%s", err, out)
		}
	})
	if binary.err != nil {
		t.Fatal(binary.err)
	}
	return binary.path
}

func runDuration(t *testing.T) time.Duration {
	t.Helper()
	if s := os.Getenv("ENGRAM_LIN_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("ENGRAM_LIN_DURATION: %v", err)
		}
		return d
	}
	return defaultDuration
}

func runSeed(t *testing.T) int64 {
	t.Helper()
	if s := os.Getenv("ENGRAM_LIN_SEED"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("ENGRAM_LIN_SEED: %v", err)
		}
		return n
	}
	return time.Now().UnixNano()
}

func soak() bool { return os.Getenv("ENGRAM_LIN_SOAK") != "" }
