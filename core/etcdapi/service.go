package etcdapi

import (
	"hash/fnv"
	"log/slog"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/lease"
	"github.com/engramkv/engram/core/mvcc"
	"github.com/engramkv/engram/core/watch"
)

// Options configure the services.
type Options struct {
	Backend *mvcc.Backend
	Hub     *watch.Hub
	Store   kv.Store
	Limits  Limits
	Logger  *slog.Logger
	// Name is this member's name; its hash is the member and cluster ID.
	Name       string
	ClientURLs []string
	// Version is reported by Status; it must be >= 3.5.13 for
	// kube-apiserver to enable RequestWatchProgress.
	Version string
	// StartedAt is reported in logs only.
	StartedAt time.Time
}

// Services implements the etcd v3 gRPC services.
type Services struct {
	b        *mvcc.Backend
	hub      *watch.Hub
	lessor   *lease.Lessor
	store    kv.Store
	limits   Limits
	log      *slog.Logger
	name     string
	urls     []string
	version  string
	memberID uint64
}

// New returns the services.
func New(opts Options) *Services {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Name == "" {
		opts.Name = "default"
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(opts.Name))
	return &Services{
		b:        opts.Backend,
		hub:      opts.Hub,
		lessor:   opts.Backend.Lessor(),
		store:    opts.Store,
		limits:   opts.Limits.withDefaults(),
		log:      opts.Logger,
		name:     opts.Name,
		urls:     opts.ClientURLs,
		version:  opts.Version,
		memberID: h.Sum64() | 1,
	}
}

// Register registers every service on gs.
func (s *Services) Register(gs *grpc.Server) {
	pb.RegisterKVServer(gs, &kvServer{s: s})
	pb.RegisterWatchServer(gs, &watchServer{s: s})
	pb.RegisterLeaseServer(gs, &leaseServer{s: s})
	pb.RegisterMaintenanceServer(gs, &maintenanceServer{s: s})
	pb.RegisterClusterServer(gs, &clusterServer{s: s})
	pb.RegisterAuthServer(gs, &authServer{})
}

func (s *Services) header(rev int64) *pb.ResponseHeader {
	return &pb.ResponseHeader{ClusterId: s.memberID, MemberId: s.memberID, Revision: rev, RaftTerm: 1}
}

func (s *Services) fillHeader(h **pb.ResponseHeader, rev int64) {
	if *h != nil && (*h).Revision != 0 {
		rev = (*h).Revision
	}
	*h = s.header(rev)
}
