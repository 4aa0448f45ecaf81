package server

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/internal/etcdapi"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/kv"
)

// A member is described by up to two meta records (DESIGN.md, "Cluster
// membership"):
//
//   - member/<name>: its advertised client URLs, comma-joined, written by
//     the node at each start. v0.9.0 nodes read this record (and derive the
//     ID from the name), so its format never changes.
//   - memberattr/<name>: what etcdctl's member commands set (memberAttrs):
//     the member's ID, peer URLs and learner flag. A member without one is
//     a voting member whose ID is its name's hash and whose peer URL is its
//     advertised client URL, as before these records existed.
//
// A member added with etcdctl member add that has not started yet is
// memberpending/<id>, the same attributes without a name; the node that
// starts advertising one of its peer URLs claims it (register). The new
// prefixes sort after "member/" and do not start with it, so an old node's
// scan of "member/" ends before them.
const (
	memberPrefix  = "member/"
	attrPrefix    = "memberattr/"
	pendingPrefix = "memberpending/"
)

// memberAttrs is the content of a memberattr or memberpending record.
type memberAttrs struct {
	ID uint64 `json:"id"`
	// PeerURLs are where the other members reach this one: forwarding to
	// it while it leads, waking it, probing it. Empty: its advertised
	// client URLs.
	PeerURLs []string `json:"peerURLs,omitempty"`
	// Learner: it never campaigns, and serves only what an etcd learner
	// serves, until promoted.
	Learner bool `json:"learner,omitempty"`
}

func pendingKey(id uint64) []byte { return coder.MetaKey(fmt.Sprintf("%s%016x", pendingPrefix, id)) }

func attrKey(name string) []byte { return coder.MetaKey(attrPrefix + name) }

func decodeAttrs(b []byte) (memberAttrs, error) {
	var a memberAttrs
	if err := json.Unmarshal(b, &a); err != nil {
		return a, fmt.Errorf("malformed member record: %w", err)
	}
	return a, nil
}

func (a memberAttrs) encode() []byte {
	b, err := json.Marshal(a)
	if err != nil {
		panic(fmt.Sprintf("server: encode member record: %v", err)) // a struct of plain fields always encodes
	}
	return b
}

// scanMeta returns the meta records whose names start with prefix.
func (s *Server) scanMeta(ctx context.Context, prefix string) ([]kv.Pair, error) {
	return scanMeta(ctx, s.opts.Store, prefix)
}

// scanMeta returns st's meta records whose names start with prefix, keyed
// by the name after it.
func scanMeta(ctx context.Context, st kv.Store, prefix string) ([]kv.Pair, error) {
	start := coder.MetaKey(prefix)
	var out []kv.Pair
	err := kv.ScanEach(ctx, st, kv.ScanOptions{Start: start, End: coder.SpaceEnd(coder.SpaceMeta)}, func(p kv.Pair) error {
		if !strings.HasPrefix(string(p.Key), string(start)) {
			return kv.SkipRest
		}
		out = append(out, kv.Pair{Key: p.Key[len(start):], Value: p.Value})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// members lists the members, started and pending, in the order of their
// IDs.
func (s *Server) members(ctx context.Context) ([]*pb.Member, error) {
	out, err := s.listMembers(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: list members: %w", mvcc.ErrUnavailable, err)
	}
	return out, nil
}

func (s *Server) listMembers(ctx context.Context) ([]*pb.Member, error) {
	started, err := s.scanMeta(ctx, memberPrefix)
	if err != nil {
		return nil, err
	}
	attrs, err := s.scanMeta(ctx, attrPrefix)
	if err != nil {
		return nil, err
	}
	pending, err := s.scanMeta(ctx, pendingPrefix)
	if err != nil {
		return nil, err
	}
	byName := make(map[string]memberAttrs, len(attrs))
	for _, p := range attrs {
		a, err := decodeAttrs(p.Value)
		if err != nil {
			return nil, fmt.Errorf("member %q: %w", p.Key, err)
		}
		byName[string(p.Key)] = a
	}
	out := make([]*pb.Member, 0, len(started)+len(pending))
	for _, p := range started {
		name := string(p.Key)
		urls := strings.Split(string(p.Value), ",")
		m := &pb.Member{ID: etcdapi.MemberID(name), Name: name, ClientURLs: urls, PeerURLs: urls}
		if a, ok := byName[name]; ok {
			m.ID, m.IsLearner = a.ID, a.Learner
			if len(a.PeerURLs) > 0 {
				m.PeerURLs = a.PeerURLs
			}
		}
		out = append(out, m)
	}
	for _, p := range pending {
		a, err := decodeAttrs(p.Value)
		if err != nil {
			return nil, fmt.Errorf("pending member %s: %w", p.Key, err)
		}
		out = append(out, &pb.Member{ID: a.ID, PeerURLs: a.PeerURLs, IsLearner: a.Learner})
	}
	// etcd lists its members in the order of their IDs.
	slices.SortFunc(out, func(a, b *pb.Member) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// register records this member so MemberList on any node lists it. A node
// with no memberattr record of its own claims the pending member (etcdctl
// member add) whose peer URLs include one of its advertised client URLs:
// it takes that member's ID, peer URLs and learner flag, in the same batch
// that deletes the pending record, so two nodes cannot both claim it. A
// node that finds none joins as a voting member, as nodes always did.
func (s *Server) register(ctx context.Context) error {
	name := s.opts.Name
	clientURLs := []byte(strings.Join(s.opts.AdvertiseClientURLs, ","))
	for attempt := 0; ; attempt++ {
		self, found, err := s.readAttrs(ctx, name)
		if err != nil {
			return fmt.Errorf("server: register member %q: %w", name, err)
		}
		ops := []kv.Op{kv.Put(coder.MetaKey(memberPrefix+name), clientURLs), s.versionRecord()}
		var claimed []byte
		if !found {
			if claimed, self, err = s.findPending(ctx); err != nil {
				return fmt.Errorf("server: register member %q: %w", name, err)
			}
			if claimed != nil {
				ops = append(ops, kv.PutIfAbsent(attrKey(name), self.encode()), kv.CompareAndDelete(pendingKey(self.ID), claimed))
			} else {
				self = memberAttrs{ID: etcdapi.MemberID(name)}
			}
		}
		err = s.opts.Store.Commit(ctx, ops)
		if _, lost := kv.AsConflict(err); lost && attempt < 3 {
			continue // another node claimed it, or the record changed: look again
		}
		if err != nil {
			return fmt.Errorf("server: register member %q: %w", name, err)
		}
		if claimed != nil {
			s.log.Info("joined as the member added for this URL", "id", fmt.Sprintf("%x", self.ID), "learner", self.Learner, "peer-urls", self.PeerURLs)
		}
		s.selfID = self.ID
		s.learner.Store(self.Learner)
		s.setPeerURL(s.peerURLOf(self))
		return nil
	}
}

// findPending returns the pending member one of whose peer URLs this node
// advertises, as stored, or nil.
func (s *Server) findPending(ctx context.Context) ([]byte, memberAttrs, error) {
	pending, err := s.scanMeta(ctx, pendingPrefix)
	if err != nil {
		return nil, memberAttrs{}, err
	}
	for _, p := range pending {
		a, err := decodeAttrs(p.Value)
		if err != nil {
			return nil, memberAttrs{}, fmt.Errorf("pending member %s: %w", p.Key, err)
		}
		for _, u := range a.PeerURLs {
			if slices.Contains(s.opts.AdvertiseClientURLs, u) {
				return p.Value, a, nil
			}
		}
	}
	return nil, memberAttrs{}, nil
}

// readAttrs reads the memberattr record of name.
func (s *Server) readAttrs(ctx context.Context, name string) (memberAttrs, bool, error) {
	b, err := s.opts.Store.Get(ctx, attrKey(name))
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return memberAttrs{}, false, nil
	case err != nil:
		return memberAttrs{}, false, err
	}
	a, err := decodeAttrs(b)
	return a, err == nil, err
}

// peerURLOf is where the other members reach this node with attributes a.
func (s *Server) peerURLOf(a memberAttrs) string {
	if len(a.PeerURLs) > 0 {
		return a.PeerURLs[0]
	}
	return s.opts.AdvertiseClientURLs[0]
}

// idOf is the member ID of the member called name: the ID its memberattr
// record holds, else its name's hash.
func (s *Server) idOf(ctx context.Context, name string) uint64 {
	a, found, err := s.readAttrs(ctx, name)
	if err != nil {
		s.log.Warn("could not read a member's record; using the ID its name gives", "member", name, "err", err)
	}
	if !found {
		return etcdapi.MemberID(name)
	}
	return a.ID
}

// refreshSelf reads this node's own record again: a promotion makes it a
// voting member, and a member update moves its peer URL, without a
// restart. It runs when another member wakes this one, when this node is
// about to campaign, and before a learner refuses a request. A failed read
// keeps what the node knew.
func (s *Server) refreshSelf(ctx context.Context) {
	a, found, err := s.readAttrs(ctx, s.opts.Name)
	if err != nil {
		s.log.Warn("could not read this member's record", "err", err)
		return
	}
	if !found {
		return
	}
	if s.learner.Swap(a.Learner) && !a.Learner {
		s.log.Info("promoted: a voting member from now on")
	}
	if url := s.peerURLOf(a); s.elector != nil && url != s.currentPeerURL() {
		s.setPeerURL(url)
		s.elector.SetURL(url)
		s.log.Info("peer URL changed", "url", url)
	}
}

func (s *Server) currentPeerURL() string {
	if url := s.peerURL.Load(); url != nil {
		return *url
	}
	return ""
}

func (s *Server) setPeerURL(url string) { s.peerURL.Store(&url) }
