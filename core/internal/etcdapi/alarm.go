package etcdapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/protobuf/proto"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
)

// alarmsRecord names the meta record holding the raised alarms, so they
// survive a restart and every member of a cluster sees the same ones, as
// etcd's alarm bucket does.
const alarmsRecord = "alarms"

// alarms are the raised alarms as the leader knows them: loaded from the
// store once per leadership (role), then kept up to date by the leader's
// own changes, which are the only ones (followers forward theirs).
type alarms struct {
	cur atomic.Pointer[alarmSet]
	mu  sync.Mutex // serialises loads and changes
}

type alarmSet struct {
	role *Role
	list []*pb.AlarmMember
}

func (a *alarmSet) has(t pb.AlarmType) bool {
	return slices.ContainsFunc(a.list, func(m *pb.AlarmMember) bool { return m.Alarm == t })
}

// readAlarms reads the alarms record from the store.
func (s *Services) readAlarms(ctx context.Context) ([]*pb.AlarmMember, error) {
	raw, err := s.store.Get(ctx, coder.MetaKey(alarmsRecord))
	if errors.Is(err, kv.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read alarms: %w", err)
	}
	var r pb.AlarmResponse
	if err := proto.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("decode alarms record: %w", err)
	}
	return r.Alarms, nil
}

// alarmsOf returns the alarms in force: a leader's cached set, a
// follower's read from the store (the leader may change it any time).
func (s *Services) alarmsOf(ctx context.Context, role *Role) (*alarmSet, error) {
	if !role.leading() {
		list, err := s.readAlarms(ctx)
		return &alarmSet{role: role, list: list}, err
	}
	if a := s.alarms.cur.Load(); a != nil && a.role == role {
		return a, nil
	}
	s.alarms.mu.Lock()
	defer s.alarms.mu.Unlock()
	if a := s.alarms.cur.Load(); a != nil && a.role == role {
		return a, nil
	}
	list, err := s.readAlarms(ctx)
	if err != nil {
		return nil, err
	}
	a := &alarmSet{role: role, list: list}
	s.alarms.cur.Store(a)
	return a, nil
}

// changeAlarm raises (on) or clears one alarm on the leader and persists
// the new set with the leader's fence. It returns the member etcd answers
// with: the alarm raised (or already raised), the alarm cleared, or nil
// when there was nothing to clear.
func (s *Services) changeAlarm(ctx context.Context, role *Role, m *pb.AlarmMember, on bool) (*pb.AlarmMember, error) {
	if _, err := s.alarmsOf(ctx, role); err != nil {
		return nil, err
	}
	s.alarms.mu.Lock()
	defer s.alarms.mu.Unlock()
	a := s.alarms.cur.Load()
	same := func(x *pb.AlarmMember) bool { return x.MemberID == m.MemberID && x.Alarm == m.Alarm }
	i := slices.IndexFunc(a.list, same)
	var list []*pb.AlarmMember
	switch {
	case on && i >= 0, !on && i < 0:
		if i < 0 {
			return nil, nil
		}
		return a.list[i], nil
	case on:
		list = append(slices.Clone(a.list), m)
		slices.SortFunc(list, func(x, y *pb.AlarmMember) int {
			return cmp.Or(cmp.Compare(x.MemberID, y.MemberID), cmp.Compare(x.Alarm, y.Alarm))
		})
	default:
		list = slices.Delete(slices.Clone(a.list), i, i+1)
	}
	raw, err := proto.Marshal(&pb.AlarmResponse{Alarms: list})
	if err != nil {
		return nil, fmt.Errorf("encode alarms record: %w", err)
	}
	if err := role.Backend.CommitMeta(ctx, []kv.Op{kv.Put(coder.MetaKey(alarmsRecord), raw)}); err != nil {
		return nil, err
	}
	s.alarms.cur.Store(&alarmSet{role: role, list: list})
	if on {
		s.log.Warn("alarm raised", "member", fmt.Sprintf("%x", m.MemberID), "alarm", m.Alarm.String())
	} else {
		s.log.Info("alarm cleared", "member", fmt.Sprintf("%x", m.MemberID), "alarm", m.Alarm.String())
	}
	return m, nil
}

// admitQuota is etcd's check of a write that adds data, made on the leader
// before the write reaches the backend: over the quota it raises NOSPACE
// for this member and refuses; while NOSPACE is raised (by anyone) it
// refuses what adds data, as etcd's capped applier does, and while CORRUPT
// is raised it refuses it with etcd's "corrupt cluster". Reads, deletes
// and compaction never come here.
func (s *Services) admitQuota(ctx context.Context, role *Role, r any) error {
	cost := writeCost(r)
	if cost == 0 {
		return nil
	}
	if !s.quota.admit(cost) {
		if _, err := s.changeAlarm(ctx, role, &pb.AlarmMember{MemberID: s.memberID, Alarm: pb.AlarmType_NOSPACE}, true); err != nil {
			s.log.Warn("raise NOSPACE alarm", "err", err)
		}
		return rpctypes.ErrGRPCNoSpace
	}
	a, err := s.alarmsOf(ctx, role)
	if err != nil {
		return toGRPC(err)
	}
	switch {
	case a.has(pb.AlarmType_CORRUPT):
		return rpctypes.ErrGRPCCorrupt
	case a.has(pb.AlarmType_NOSPACE):
		return rpctypes.ErrGRPCNoSpace
	}
	return nil
}

// Alarm answers etcd's alarm calls: GET lists the raised alarms of a type
// (all for NONE), ACTIVATE raises one (NONE raises nothing), DEACTIVATE
// clears one; the changes answer the alarm concerned, or nothing when
// there was nothing to do, never an error. A follower lists from the store
// and forwards changes to the leader, which alone writes. Who may call it
// is checked by the admin interceptor (authz_admin.go).
func (m *maintenanceServer) Alarm(ctx context.Context, r *pb.AlarmRequest) (*pb.AlarmResponse, error) {
	role := m.s.current()
	resp := &pb.AlarmResponse{}
	switch r.Action {
	case pb.AlarmRequest_GET:
		a, err := m.s.alarmsOf(ctx, role)
		if err != nil {
			return nil, toGRPC(err)
		}
		for _, x := range a.list {
			if r.Alarm == pb.AlarmType_NONE || x.Alarm == r.Alarm {
				resp.Alarms = append(resp.Alarms, x)
			}
		}
	case pb.AlarmRequest_ACTIVATE, pb.AlarmRequest_DEACTIVATE:
		if !role.leading() {
			return forward(ctx, role, pb.NewMaintenanceClient, pb.MaintenanceClient.Alarm, r)
		}
		on := r.Action == pb.AlarmRequest_ACTIVATE
		if on && r.Alarm == pb.AlarmType_NONE {
			break
		}
		x, err := m.s.changeAlarm(ctx, role, &pb.AlarmMember{MemberID: r.MemberID, Alarm: r.Alarm}, on)
		if err != nil {
			return nil, toGRPC(err)
		}
		if x != nil {
			resp.Alarms = append(resp.Alarms, x)
		}
		if !on {
			// An operator disarms once space is back: the next write
			// must see the store's size now, not the window's.
			m.s.quota.remeasure()
		}
	}
	resp.Header = m.s.header(role.Backend.Rev())
	return resp, nil
}

// statusAlarms fills Status's alarm fields as etcd does: each raised alarm
// as an error line, and the quota.
func (s *Services) statusAlarms(ctx context.Context, resp *pb.StatusResponse) {
	if s.quota != nil {
		resp.DbSizeQuota = s.quota.limit
	}
	a, err := s.alarmsOf(ctx, s.current())
	if err != nil {
		resp.Errors = append(resp.Errors, err.Error())
		return
	}
	for _, x := range a.list {
		resp.Errors = append(resp.Errors, alarmText(x))
	}
}

// alarmText is an alarm as etcd 3.6 words it in Status's errors: its
// protobuf text form, the fields that are set each followed by a space
// (etcd's gogo-generated String; this API's own String differs).
func alarmText(m *pb.AlarmMember) string {
	var b strings.Builder
	if m.MemberID != 0 {
		fmt.Fprintf(&b, "memberID:%d ", m.MemberID)
	}
	if m.Alarm != pb.AlarmType_NONE {
		fmt.Fprintf(&b, "alarm:%s ", m.Alarm)
	}
	return b.String()
}
