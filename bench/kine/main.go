// Command kine is k3s's etcd shim (github.com/k3s-io/kine), built from the
// Go module proxy for the SQL section of the benchmarks (make bench-sql):
// Engram on PostgreSQL and MariaDB is measured beside kine on the same
// database server in the same run.
//
// This wrapper module pins kine's version in its go.mod and calls kine's own
// entry point (pkg/app, what kine's main runs) unchanged, so that the
// reference is kine as k3s ships it. It must stay a plain wrapper: a flag
// or behaviour added here would make the reference something else.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/k3s-io/kine/pkg/app"
)

func main() {
	if err := app.New().Run(os.Args); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "kine:", err)
		os.Exit(1)
	}
}
