// Command engram is the Engram server binary: an etcd v3 API server over a
// pluggable storage engine.
//
// This package owns process concerns only: subcommand dispatch, opening the
// configured storage engine, sockets, TLS, the operational HTTP endpoint,
// signals and the shutdown order. Everything etcd-shaped (MVCC, watches,
// leases, the gRPC services) lives in core/server and must not leak in here;
// configuration rules live in internal/config.
package main

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// command is one subcommand of the binary. New subcommands (bench, plugin)
// are added to commands below.
type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{name: "serve", summary: "run the server (the default when no command is given)", run: serveMain},
		{name: "version", summary: "print version information", run: versionMain},
		{name: "plugin", summary: "inspect a wasm storage plugin (info), verify it against the adaptor contract (verify), measure its per-call cost (bench)", run: pluginMain},
		{name: "snapshot", summary: "restore an etcd snapshot into the store (restore), or describe one (status)", run: snapshotMain},
		{name: "migrate", summary: "move a running etcd (or any etcd v3 endpoint) into the store keeping every revision; verify a migration", run: migrateMain},
		{name: "bench", summary: "load any etcd v3 endpoint with kube-apiserver-shaped requests", run: benchMain},
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches to a subcommand and returns the process exit code: 0 on
// success, 1 when the command failed, 2 on a usage or configuration error.
func run(args []string, stdout, stderr io.Writer) int {
	name, rest := "serve", args
	// `engram --flag ...` and a bare `engram` mean `engram serve ...`.
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, rest = args[0], args[1:]
	}
	if name == "help" {
		usage(stdout)
		return 0
	}
	for _, c := range commands() {
		if c.name == name {
			return c.run(rest, stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "engram: unknown command %q\n\n", name)
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: engram [command] [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'engram serve --help' for the server's settings.")
}
