package tikv_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/pingcap/failpoint"
	tikvclient "github.com/tikv/client-go/v2/tikv"
)

// TestMain makes the mock's stores count as reachable whatever happens.
//
// When an RPC fails, client-go marks the TiKV store as possibly down and
// probes it with a gRPC health check on its address; the mock's stores have
// no address, so after the first injected RPC failure (fault_test.go) the
// store would stay "unreachable" and every later request would fail.
// client-go's own tests solve this with its injectLiveness failpoint, a
// runtime switch (no code rewriting); it must be set before any client
// exists, and it only affects this test binary.
func TestMain(m *testing.M) {
	tikvclient.EnableFailpoints()
	if err := failpoint.Enable("tikvclient/injectLiveness", `return("reachable")`); err != nil {
		fmt.Fprintln(os.Stderr, "enable failpoint:", err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}
