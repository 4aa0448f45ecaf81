package migrate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/engramkv/engram/core/internal/mvcc/transfer"
)

// cutover completes the migration at revision target, once everything up
// to it is applied: it verifies the source did not move, makes the store
// servable, and verifies it against the source. done is false when the
// source moved on (the import record is back and following continues).
func (m *migration) cutover(ctx context.Context, target int64) (Result, bool, error) {
	if err := m.syncLeases(ctx); err != nil {
		return Result{}, false, err
	}
	if err := m.flush(ctx); err != nil {
		return Result{}, false, err
	}
	if rev, err := m.sourceRevision(ctx); err != nil {
		return Result{}, false, err
	} else if rev != target {
		m.log.Warn("the source moved during the cut-over; draining again", "from", target, "to", rev)
		return Result{}, false, nil
	}
	rec := m.im.Record()
	// The target takes the source's compacted revision as it is now (the
	// source's compactor may have run while the migration followed): both
	// then refuse the same old revisions, and their HashKV, which depends
	// on it, compare.
	source := &hashMemo{Side: Remote{Client: m.opts.Client}, rev: target}
	cctx, cancel := context.WithTimeout(ctx, hashTimeout)
	source.hash, source.compact, source.err = source.Side.HashKV(cctx, target)
	cancel()
	switch {
	case notSupported(source.err):
		// Verify compares keys instead; the source's compacted
		// revision is unknown, so the target keeps its own.
		source.compact = 0
	case source.err != nil:
		return Result{}, false, fmt.Errorf("migrate: HashKV of the source at %d: %w", target, source.err)
	}
	compact := min(max(rec.CompactRev, source.compact), target)
	res := Result{BaseRev: m.ph.BaseRev, CompactRev: compact, Rev: target, Base: m.ph.base()}
	if err := m.im.Finish(ctx, transfer.FinishOptions{Rev: target, CompactRev: compact}); err != nil {
		return res, false, err
	}
	verified, err := m.verify(ctx, source, target)
	if err == nil {
		if rev, rerr := m.sourceRevision(ctx); rerr != nil {
			err = rerr
		} else if rev != target {
			err = fmt.Errorf("%w: revision %d while verifying at %d", ErrNotQuiet, rev, target)
		}
	}
	if err != nil {
		// Not servable after all: put the import record back.
		if rerr := transfer.Unfinish(ctx, m.opts.Store, rec); rerr != nil {
			return res, false, errors.Join(err, rerr)
		}
		if errors.Is(err, ErrNotQuiet) {
			m.log.Warn("the source moved during verification; draining again", "err", err)
			m.im, err = transfer.NewImporter(ctx, m.resumeOptions(rec))
			return res, false, err
		}
		return res, false, err
	}
	res.Verified = verified
	m.checkAuth(ctx)
	return res, true, nil
}

// checkAuth warns when the source's users, roles or permissions changed
// after the base snapshot: the target has them as of the base (the follow
// phase sees keys only), and a change must be made again on the target.
func (m *migration) checkAuth(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	st, err := m.opts.Client.AuthStatus(cctx)
	if notSupported(err) {
		// No auth at the source (kine): nothing could have changed.
		return
	}
	if err != nil {
		m.log.Warn("could not read the source's auth revision to check that users and roles did not change after the base snapshot", "err", err)
		return
	}
	// A source that never used auth reports revision 1 over a file that
	// says 0 or 1.
	if max(st.AuthRevision, 1) != max(m.ph.AuthRev, 1) || st.Enabled != m.ph.AuthEnabled {
		m.log.Warn("users, roles, permissions or auth enable changed on the source after the base snapshot; the target has them as of the base: make those changes again on the target",
			"base_auth_revision", m.ph.AuthRev, "source_auth_revision", st.AuthRevision, "base_auth_enabled", m.ph.AuthEnabled, "source_auth_enabled", st.Enabled)
	}
}

// verify compares the finished store with the source at rev.
func (m *migration) verify(ctx context.Context, source Side, rev int64) (string, error) {
	local, err := OpenLocal(ctx, m.opts.Store, m.opts.TempDir)
	if err != nil {
		return "", err
	}
	defer local.Close()
	return Verify(ctx, source, local, VerifyOptions{Rev: rev, Prefix: m.opts.Prefix})
}

// hashTimeout bounds the source's HashKV at the cut-over: it reads the
// whole keyspace, so it may take far longer than other calls.
const hashTimeout = 10 * time.Minute

// hashMemo is a Side whose HashKV at rev was already asked: the cut-over
// needs it before finishing (for the compacted revision) and to verify, and
// it costs a read of the source's whole keyspace.
type hashMemo struct {
	Side
	rev     int64
	hash    uint32
	compact int64
	err     error
}

func (h *hashMemo) HashKV(ctx context.Context, rev int64) (uint32, int64, error) {
	if rev == h.rev {
		return h.hash, h.compact, h.err
	}
	return h.Side.HashKV(ctx, rev)
}
