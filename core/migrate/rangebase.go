package migrate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/internal/mvcc/transfer"
)

// A Range base reads the source's live keys at one revision B, page by
// page (each page a Range at B from the key after the last one), into a
// sorter that spills to disk, then imports them in mod revision order, as the importer
// takes rows: each key at its own mod and create revision and version,
// keys sharing a mod revision (one transaction) in key order as their sub
// revisions. What is lost against a snapshot: the history below B (the
// target reports itself compacted at B, so a client watching from an older
// revision relists, as after any compaction), the true sub revision order
// within a revision, and users and roles.

// rangeBounds are the ranges tried for the whole keyspace, in order, until
// one lists as many keys as the source counts at B. The first is etcd's
// whole keyspace. kine maps it to its own "everything" form, which at a
// past revision lists nothing, and keeps keys as text that can hold no NUL
// byte and must be valid UTF-8; the second covers every such key.
var rangeBounds = [][2]string{
	{"\x00", "\x00"},
	{"\x01", "\U0010FFFF\U0010FFFF"},
}

// rangeBase copies the base by a paginated Range and imports it.
func (m *migration) rangeBase(ctx context.Context, rec mvcc.ImportRecord) error {
	sorter := etcdfmt.NewSorter(m.opts.TempDir, 0)
	defer sorter.Close()
	rev, err := m.readRange(ctx, sorter)
	if err != nil {
		return err
	}
	rec.CompactRev = rev
	m.ph = phase{Phase: "base", BaseRev: rev, Prefix: m.opts.Prefix, Base: BaseRange}
	rec.Extra, _ = json.Marshal(m.ph)
	im, err := transfer.NewImporter(ctx, transfer.ImportOptions{Store: m.opts.Store, Logger: m.log, Record: rec, CountVersions: true})
	if err != nil {
		return err
	}
	m.im = im
	if err := m.syncLeases(ctx); err != nil {
		return err
	}
	m.log.Info("importing the keys read at the base revision", "revision", rev, "keys", sorter.Len())
	var (
		last    = time.Now()
		prevRev int64
		sub     int64
	)
	err = sorter.Each(ctx, func(e *etcdfmt.Entry) error {
		// Sub revisions were the listing order, to keep one revision's
		// keys in key order; etcd numbers them from 0.
		if e.Rev.Main == prevRev {
			sub++
		} else {
			prevRev, sub = e.Rev.Main, 0
		}
		e.Rev.Sub = sub
		if l := e.KV.Lease; l != 0 && !im.HasLease(l) {
			if err := m.fetchLease(ctx, l); err != nil {
				return err
			}
		}
		m.rows++
		if time.Since(last) > time.Second {
			last = time.Now()
			m.report(Progress{Phase: "base", Rows: m.rows, SourceRev: rev})
		}
		return im.Add(ctx, e)
	})
	if err != nil {
		return fmt.Errorf("migrate: import the base: %w", err)
	}
	m.log.Info("no users or roles are copied by a Range base (only a snapshot carries them); create them on the target if the source had any")
	if err := im.Advance(ctx, rev); err != nil {
		return err
	}
	m.ph.Phase = "follow"
	m.sourceRev = rev
	return m.flush(ctx)
}

// readRange lists the live keys at one revision into sorter and returns
// the revision. Every call waits at most the idle timeout for the source.
func (m *migration) readRange(ctx context.Context, sorter *etcdfmt.Sorter) (int64, error) {
	idle := newIdleWatch(ctx, m.opts.IdleTimeout)
	defer idle.stop()
	r, err := m.opts.Client.Get(idle.ctx, "\x00", clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("migrate: read the source's revision: %w", idle.err(err, "its revision"))
	}
	rev := r.Header.Revision
	idle.touch()
	bounds := rangeBounds
	if len(m.opts.Prefix) > 0 {
		bounds = [][2]string{{string(m.opts.Prefix), string(prefixEnd(m.opts.Prefix))}}
	}
	count, err := m.countAt(idle, bounds[0], rev)
	if err != nil {
		return 0, err
	}
	m.log.Info("reading the source's keys by a paginated Range", "revision", rev, "keys", count)
	for _, b := range bounds {
		if sorter.Len() > 0 {
			// A form that listed keys, but not all, cannot be
			// completed by another.
			break
		}
		listed, err := m.listPages(idle, sorter, b, rev)
		if err != nil {
			return 0, err
		}
		if listed == count {
			return rev, nil
		}
		m.log.Info("the source listed another number of keys than it counts for this range", "range", fmt.Sprintf("[%q, %q)", b[0], b[1]), "listed", listed, "counted", count)
	}
	return 0, fmt.Errorf("migrate: the source counts %d keys at revision %d but its Range lists another number: it cannot be copied by Range", count, rev)
}

// countAt counts the keys in b at rev.
func (m *migration) countAt(idle *idleWatch, b [2]string, rev int64) (int64, error) {
	r, err := m.opts.Client.Get(idle.ctx, b[0], clientv3.WithRange(b[1]), clientv3.WithRev(rev), clientv3.WithCountOnly())
	if err != nil {
		return 0, m.rangeErr(idle, err, rev)
	}
	idle.touch()
	return r.Count, nil
}

// firstWriteRev is the first revision a write can have: etcd's store
// starts at revision 1 with nothing in it.
const firstWriteRev = 2

// listPages lists b at rev into sorter, each key at its mod revision with
// its listing position as sub revision; listed counts the keys as the
// source sent them. A key is added once (see addListed).
func (m *migration) listPages(idle *idleWatch, sorter *etcdfmt.Sorter, b [2]string, rev int64) (int64, error) {
	var (
		listed  int64
		pending *etcdfmt.Entry
		dup     bool // pending was listed more than once
		key     = b[0]
		last    = time.Now()
	)
	for {
		r, err := m.opts.Client.Get(idle.ctx, key, clientv3.WithRange(b[1]), clientv3.WithRev(rev), clientv3.WithLimit(m.opts.PageSize))
		if err != nil {
			return 0, m.rangeErr(idle, err, rev)
		}
		idle.touch()
		for _, kv := range r.Kvs {
			e := &etcdfmt.Entry{Rev: etcdfmt.Revision{Main: kv.ModRevision, Sub: listed}, KV: etcdfmt.KeyValueOf(kv)}
			listed++
			if pending != nil {
				switch c := bytes.Compare(kv.Key, pending.KV.Key); {
				case c < 0:
					return 0, fmt.Errorf("migrate: the source's Range is not in key order: %q after %q", kv.Key, pending.KV.Key)
				case c == 0:
					pending, dup = e, true
					continue
				}
				if err := m.addListed(idle, sorter, pending, dup, rev); err != nil {
					return 0, err
				}
			}
			pending, dup = e, false
		}
		if time.Since(last) > time.Second {
			last = time.Now()
			m.report(Progress{Phase: "base", Rows: sorter.Len(), SourceRev: rev})
		}
		if !r.More || len(r.Kvs) == 0 {
			break
		}
		key = string(r.Kvs[len(r.Kvs)-1].Key) + "\x00"
	}
	if pending != nil {
		if err := m.addListed(idle, sorter, pending, dup, rev); err != nil {
			return 0, err
		}
	}
	return listed, nil
}

// addListed adds a listed key to sorter, unless what the source lists is
// not what a client reading the key gets. kine lists its own
// compact_rev_key row (its first, at revision 1, where etcd has no write)
// under the name of the apiserver's, which its Get answers instead, or
// answers with nothing before the apiserver's compactor has written it.
// So a key listed twice, or at a revision no write can have, is read by a
// Get at rev, and what that answers, if anything, is added.
func (m *migration) addListed(idle *idleWatch, sorter *etcdfmt.Sorter, e *etcdfmt.Entry, dup bool, rev int64) error {
	if dup || e.Rev.Main < firstWriteRev {
		r, err := m.opts.Client.Get(idle.ctx, string(e.KV.Key), clientv3.WithRev(rev))
		if err != nil {
			return m.rangeErr(idle, err, rev)
		}
		idle.touch()
		if len(r.Kvs) == 0 {
			m.log.Info("leaving out a key the source lists but answers nothing for when read (kine's own compact_rev_key row)", "key", string(e.KV.Key), "listed_revision", e.Rev.Main)
			return nil
		}
		kv := r.Kvs[0]
		if kv.ModRevision < firstWriteRev {
			return fmt.Errorf("migrate: the source's key %q is at revision %d, below the first revision a write can have (%d)", kv.Key, kv.ModRevision, firstWriteRev)
		}
		e.Rev.Main, e.KV = kv.ModRevision, etcdfmt.KeyValueOf(kv)
	}
	if err := sorter.Add(e); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// rangeErr names a failed page: the source compacted past the base
// revision while it was read, it went silent, or something else.
func (m *migration) rangeErr(idle *idleWatch, err error, rev int64) error {
	if errors.Is(err, rpctypes.ErrCompacted) {
		return fmt.Errorf("%w: it compacted past the base revision %d while the base was read; run again (kine compacts every 5 minutes by default)", ErrSourceCompacted, rev)
	}
	return fmt.Errorf("migrate: Range of the source at revision %d: %w", rev, idle.err(err, "a page of its keys"))
}
