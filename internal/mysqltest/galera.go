package mysqltest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/engramkv/engram/internal/proctest"
)

// GaleraProvider is the Galera library Debian's galera-4 installs (a
// dependency of mariadb-server).
const GaleraProvider = "/usr/lib/galera/libgalera_smm.so"

// A Cluster is a throwaway MariaDB Galera cluster on 127.0.0.1: every node
// a mariadbd of its own (SQL, group communication, incremental and full
// state transfer each on a port chosen at run time), the first one
// bootstrapping the cluster and the others joining it by state transfer
// (rsync). Tests stop, kill, pause and restart nodes to make the faults a
// replicated engine meets: a node that crashed and rejoins, a node that
// stops answering, a cluster that loses quorum.
type Cluster struct {
	// Nodes are the cluster's nodes, in start order.
	Nodes []*Server

	cred    *syscall.Credential
	address string // gcomm://... of every node

	mu   sync.Mutex
	dead []*proctest.Proc // killed incarnations, stopped with the cluster
}

// galeraNode is what a node of a Cluster needs to start again: its place
// in the cluster and its Galera ports (group communication, incremental
// and full state transfer).
type galeraNode struct {
	index          int
	gcomm, ist, st int
}

// StartGalera launches a cluster of n nodes for t and stops it at
// t.Cleanup, skipping t without MariaDB or Galera unless CI is set.
func StartGalera(t testing.TB, n int) *Cluster {
	t.Helper()
	return proctest.StartFor(t, "Galera cluster", func() (*Cluster, error) { return LaunchGalera(n) }, ErrNotInstalled)
}

// LaunchGalera starts a cluster of n nodes and waits until every node is
// synced. The caller stops it with Stop.
func LaunchGalera(n int) (*Cluster, error) {
	b, err := findBins()
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(GaleraProvider); err != nil {
		return nil, fmt.Errorf("%w: Galera provider: %v (apt-get install galera-4)", ErrNotInstalled, err)
	}
	return proctest.Retry(3, func() (*Cluster, error) { return launchGalera(b, n) })
}

func launchGalera(b bins, n int) (*Cluster, error) {
	c := &Cluster{}
	ok := false
	defer func() {
		if !ok {
			_ = c.Stop()
		}
	}()
	var members []string
	for i := range n {
		var ports [4]int
		for j := range ports {
			var err error
			if ports[j], err = proctest.FreePort(); err != nil {
				return nil, fmt.Errorf("mysqltest: %w", err)
			}
		}
		// A directory of its own per node, which its server's reaper
		// removes even if this process dies.
		dir, cred, err := proctest.TempDir("mysql", "engram-galera-n"+strconv.Itoa(i+1)+"-")
		if err != nil {
			return nil, fmt.Errorf("mysqltest: %w", err)
		}
		c.cred = cred
		if err := os.Mkdir(filepath.Join(dir, "data"), 0o755); err != nil {
			return nil, fmt.Errorf("mysqltest: %w", err)
		}
		if cred != nil {
			if err := os.Chown(filepath.Join(dir, "data"), int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, fmt.Errorf("mysqltest: %w", err)
			}
		}
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(ports[0]), Port: ports[0], Dir: dir, bins: b,
			galera: &galeraNode{index: i, gcomm: ports[1], ist: ports[2], st: ports[3]}}
		c.Nodes = append(c.Nodes, s)
		members = append(members, "127.0.0.1:"+strconv.Itoa(ports[1]))
	}
	c.address = "gcomm://" + strings.Join(members, ",")

	// Only the first node gets a system database (and the init file's
	// users and database); the others receive all of it by state transfer.
	first := c.Nodes[0]
	if err := installDB(b, first.Dir, c.cred); err != nil {
		return nil, err
	}
	if err := c.start(first, true); err != nil {
		return nil, err
	}
	for _, s := range c.Nodes[1:] {
		if err := c.start(s, false); err != nil {
			return nil, err
		}
	}
	for _, s := range c.Nodes {
		if err := c.waitSynced(s, 2*time.Minute); err != nil {
			return nil, err
		}
	}
	version := serverVersion(b)
	for _, s := range c.Nodes {
		s.Version = version
	}
	ok = true
	return c, nil
}

// start runs a new incarnation of node s, bootstrapping a new cluster when
// bootstrap is set.
func (c *Cluster) start(s *Server, bootstrap bool) error {
	g := s.galera
	node := "127.0.0.1:" + strconv.Itoa(g.gcomm)
	var initSQL string
	if bootstrap {
		// The users and database of the init file reach the other nodes
		// with the state transfer of the whole data directory.
		var err error
		if initSQL, err = writeInitFile(s.Dir); err != nil {
			return err
		}
	}
	cmd := s.command(c.cred, false, initSQL)
	cmd.Args = append(cmd.Args, "--binlog-format=ROW", "--innodb-autoinc-lock-mode=2",
		"--wsrep-on=ON", "--wsrep-provider="+GaleraProvider, "--wsrep-cluster-address="+c.address,
		"--wsrep-cluster-name=engram-test", "--wsrep-node-name=n"+strconv.Itoa(g.index+1),
		"--wsrep-node-address="+node, "--wsrep-node-incoming-address="+s.Addr,
		"--wsrep-sst-method=rsync", "--wsrep-sst-receive-address=127.0.0.1:"+strconv.Itoa(g.st),
		"--wsrep-provider-options=base_host=127.0.0.1;base_port="+strconv.Itoa(g.gcomm)+
			";gmcast.listen_addr=tcp://"+node+";ist.recv_addr=127.0.0.1:"+strconv.Itoa(g.ist)+";gcache.size=32M")
	if bootstrap {
		cmd.Args = append(cmd.Args, "--wsrep-new-cluster")
	}
	proc, err := proctest.Start("mariadbd n"+strconv.Itoa(g.index+1), cmd, s.Dir, syscall.SIGTERM, c.cred)
	if err != nil {
		return fmt.Errorf("mysqltest: %w", err)
	}
	s.proc = proc
	return nil
}

// waitSynced waits until node s serves clients as a synced member of the
// primary component.
func (c *Cluster) waitSynced(s *Server, timeout time.Duration) error {
	err := s.proc.WaitReady(timeout, func() error {
		out, err := s.Exec("mysql", "SHOW STATUS LIKE 'wsrep_local_state_comment'")
		if err != nil {
			return err
		}
		if !strings.Contains(out, "Synced") {
			return errors.New(strings.TrimSpace(out))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("mysqltest: galera node %s: %w", s.Addr, err)
	}
	return nil
}

// Kill ends node i's mariadbd with SIGKILL, as a crash would, and waits
// until it has exited. Its data directory stays for Restart.
func (c *Cluster) Kill(i int) error {
	s := c.Nodes[i]
	if err := s.proc.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("mysqltest: killing node %d: %w", i, err)
	}
	<-s.proc.Exited()
	c.mu.Lock()
	c.dead = append(c.dead, s.proc)
	c.mu.Unlock()
	return nil
}

// Restart starts node i again after Kill and waits until it rejoined the
// cluster (by incremental or full state transfer) and is synced.
func (c *Cluster) Restart(i int) error {
	s := c.Nodes[i]
	if err := c.start(s, false); err != nil {
		return err
	}
	return c.waitSynced(s, 2*time.Minute)
}

// Pause stops node i's mariadbd with SIGSTOP: it holds its connections and
// answers nothing, and the other nodes soon count it gone, as a network
// partition would make them. Resume ends it.
func (c *Cluster) Pause(i int) error { return c.Nodes[i].proc.Signal(syscall.SIGSTOP) }

// Resume continues a paused node.
func (c *Cluster) Resume(i int) error { return c.Nodes[i].proc.Signal(syscall.SIGCONT) }

// WaitSynced waits until node i is a synced member of the primary
// component again (after Resume, or after its peers came back).
func (c *Cluster) WaitSynced(i int) error { return c.waitSynced(c.Nodes[i], 2*time.Minute) }

// Stop stops every node and removes its directory. It is safe to call
// more than once.
func (c *Cluster) Stop() error {
	var errs []error
	for _, s := range c.Nodes {
		if s.proc == nil {
			_ = os.RemoveAll(s.Dir) // never started
			continue
		}
		_ = s.proc.Signal(syscall.SIGCONT) // a paused node cannot stop
		if err := s.proc.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	c.mu.Lock()
	dead := c.dead
	c.dead = nil
	c.mu.Unlock()
	for _, p := range dead {
		_ = p.Stop() // exited already; this ends its reaper
	}
	return errors.Join(errs...)
}
