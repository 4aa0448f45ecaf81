package etcdapi

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/backup"
	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/core/internal/mvcc/transfer"
	"github.com/engramkv/engram/core/kv"
)

type maintenanceServer struct {
	pb.UnimplementedMaintenanceServer
	s *Services
}

func (m *maintenanceServer) Status(ctx context.Context, r *pb.StatusRequest) (*pb.StatusResponse, error) {
	m.s.sendRelease(ctx)
	if err := m.s.authorizeCaller(ctx); err != nil {
		return nil, err
	}
	var size int64
	if sz, ok := m.s.store.(kv.Sizer); ok {
		if n, err := sz.Size(); err == nil {
			size = n
		}
	}
	role := m.s.current()
	rev := role.Backend.Rev()
	resp := &pb.StatusResponse{
		Header:           m.s.header(rev),
		Version:          m.s.version,
		DbSize:           size,
		DbSizeInUse:      size,
		Leader:           role.LeaderID,
		RaftIndex:        uint64(rev),
		RaftTerm:         1,
		RaftAppliedIndex: uint64(rev),
		StorageVersion:   "3.6.0",
		IsLearner:        m.s.isLearner != nil && m.s.isLearner(),
	}
	if m.s.downgrader != nil {
		resp.DowngradeInfo = m.s.downgrader.DowngradeInfo(ctx)
	}
	m.s.statusAlarms(ctx, resp)
	return resp, nil
}

// Hash answers etcd's deprecated whole-database hash. etcd hashes its bbolt
// file, which Engram does not have; it answers with HashKV's value at the
// current revision, which is comparable between Engram nodes and stable
// across restarts, but not with etcd's Hash.
func (m *maintenanceServer) Hash(ctx context.Context, r *pb.HashRequest) (*pb.HashResponse, error) {
	if err := m.s.authorizeAdmin(ctx); err != nil {
		return nil, err
	}
	h, err := transfer.HashKV(ctx, m.s.current().Backend, 0)
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.HashResponse{Header: m.s.header(h.CurrentRev), Hash: h.Hash}, nil
}

// HashKV computes etcd's own HashKV value, so `etcdctl endpoint hashkv`
// agrees between etcd and Engram stores holding the same history.
func (m *maintenanceServer) HashKV(ctx context.Context, r *pb.HashKVRequest) (*pb.HashKVResponse, error) {
	if err := m.s.authorizeAdmin(ctx); err != nil {
		return nil, err
	}
	h, err := transfer.HashKV(ctx, m.s.current().Backend, r.Revision)
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.HashKVResponse{Header: m.s.header(h.CurrentRev), Hash: h.Hash, CompactRevision: h.CompactRev, HashRevision: h.Rev}, nil
}

// Defragment is `etcdctl defrag`: the engine gives back the space deleted
// keys still take, now, when it can (kv.Reclaimer), and the call succeeds
// as etcd's does, with an empty response (etcd sets no header on it). An
// engine without a Reclaimer manages its space by itself: success, no work.
//
// A follower forwards the call to the leader instead of reclaiming the
// shared store itself: followers never write to it (the badger flush
// writes), and the store is one for every member, so the leader's
// reclamation is the member's. Without a leader it answers etcd's "no
// leader", as for the other calls only the leader serves.
//
// A failure of the engine answers as etcd answers a failed defrag: code
// Unknown with the error's text (etcd 3.6 v3rpc/maintenance.go,
// togRPCError); a closed store or an ended context with the codes etcd
// uses for those.
func (m *maintenanceServer) Defragment(ctx context.Context, r *pb.DefragmentRequest) (*pb.DefragmentResponse, error) {
	if err := m.s.authorizeAdmin(ctx); err != nil {
		return nil, err
	}
	role := m.s.current()
	if !role.leading() {
		return forward(ctx, role, pb.NewMaintenanceClient, pb.MaintenanceClient.Defragment, r)
	}
	rc, ok := m.s.store.(kv.Reclaimer)
	if !ok {
		m.s.log.Info("defragment: the storage engine reclaims space by itself; nothing to do")
		return &pb.DefragmentResponse{}, nil
	}
	m.s.log.Info("starting defragment: reclaiming the storage engine's deleted space")
	start := time.Now()
	if err := rc.Reclaim(ctx); err != nil {
		m.s.log.Warn("defragment failed", "err", err)
		switch {
		case errors.Is(err, kv.ErrClosed):
			return nil, rpctypes.ErrGRPCStopped
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			return nil, toGRPC(err)
		}
		return nil, status.Error(codes.Unknown, err.Error())
	}
	m.s.quota.remeasure() // space was given back: the quota sees it now
	m.s.log.Info("finished defragment", "took", time.Since(start).Round(time.Millisecond))
	return &pb.DefragmentResponse{}, nil
}

// snapshotChunk is the size of each streamed piece, as etcd sends them.
const snapshotChunk = 32 << 10

// Snapshot streams an etcd snapshot file of the store, as etcd does: the
// file in chunks with the bytes remaining after each, then one last message
// whose blob is the sha256 of everything sent, which etcdutl checks on
// restore. The file is built on disk from one consistent read first (so
// RemainingBytes is exact and server memory stays bounded whatever the data
// size), then streamed and removed.
func (m *maintenanceServer) Snapshot(r *pb.SnapshotRequest, s pb.Maintenance_SnapshotServer) error {
	if err := m.s.authorizeAdmin(s.Context()); err != nil {
		return err
	}
	ctx := s.Context()
	b := m.s.current().Backend
	path, err := backup.TempFile(b.TempDir())
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	defer os.Remove(path)
	info, err := backup.Save(ctx, b, m.s.store, path, b.TempDir())
	if err != nil {
		return toGRPC(err)
	}
	m.s.log.Info("sending snapshot", "revision", info.Revision, "compacted", info.CompactRev, "bytes", info.TotalSize)
	f, err := os.Open(path)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	total, sent := st.Size(), int64(0)
	sum := sha256.New()
	buf := make([]byte, snapshotChunk)
	for sent < total {
		n, err := io.ReadFull(f, buf[:min(int64(len(buf)), total-sent)])
		if err != nil {
			return status.Errorf(codes.Internal, "read snapshot: %v", err)
		}
		sent += int64(n)
		sum.Write(buf[:n])
		// One buffer serves every chunk: gRPC encodes the message
		// before Send returns and keeps only the encoding. (A stats
		// handler may read a message after Send; the server installs
		// none. Copying each chunk cost a byte of garbage per byte
		// sent.)
		if err := s.Send(&pb.SnapshotResponse{RemainingBytes: uint64(total - sent), Blob: buf[:n], Version: etcdfmt.StorageVersion}); err != nil {
			return err
		}
	}
	return s.Send(&pb.SnapshotResponse{Blob: sum.Sum(nil), Version: etcdfmt.StorageVersion})
}
