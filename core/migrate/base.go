package migrate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/core/internal/auth"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/internal/mvcc/transfer"
	"github.com/engramkv/engram/core/snapshot"
)

// errNoSnapshot means the source answered Snapshot that it serves none.
var errNoSnapshot = errors.New("migrate: the source serves no snapshot")

// snapshotBase downloads the source's snapshot and imports it.
func (m *migration) snapshotBase(ctx context.Context, rec mvcc.ImportRecord) error {
	path, err := m.download(ctx)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	f, err := snapshot.Open(path, snapshot.OpenOptions{})
	if err != nil {
		return fmt.Errorf("migrate: the source's snapshot: %w", err)
	}
	defer f.Close()
	info := f.Info()
	rec.CompactRev = info.CompactRev
	m.ph = phase{Phase: "base", BaseRev: info.Revision, Prefix: m.opts.Prefix, Base: BaseSnapshot}
	rec.Extra, _ = json.Marshal(m.ph)
	im, err := transfer.NewImporter(ctx, transfer.ImportOptions{Store: m.opts.Store, Logger: m.log, Record: rec})
	if err != nil {
		return err
	}
	m.im = im
	leases, err := f.Leases()
	if err != nil {
		return err
	}
	for _, l := range leases {
		if err := im.Lease(l.ID, max(l.TTL, 1)); err != nil {
			return err
		}
	}
	m.log.Info("importing the base snapshot", "revision", info.Revision, "compacted", info.CompactRev, "rows", info.TotalKeys)
	last := time.Now()
	err = f.Entries(ctx, func(e *etcdfmt.Entry) error {
		if !bytes.HasPrefix(e.KV.Key, m.opts.Prefix) {
			return nil
		}
		m.rows++
		if time.Since(last) > time.Second {
			last = time.Now()
			m.report(Progress{Phase: "base", Rows: m.rows, SourceRev: info.Revision})
		}
		return im.Add(ctx, e)
	})
	if err != nil {
		return fmt.Errorf("migrate: import the base: %w", err)
	}
	// Users and roles come from the base only: etcd's watch carries no
	// auth change, so the cut-over compares the source's auth revision
	// with this one (checkAuth).
	a, err := f.Auth()
	if err != nil {
		return fmt.Errorf("migrate: the source's snapshot: %w", err)
	}
	if err := auth.Import(ctx, m.opts.Store, a); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if !a.Empty() {
		m.log.Info("imported the source's users and roles", "auth_enabled", a.Enabled, "users", len(a.Users), "roles", len(a.Roles), "auth_revision", a.Revision)
	}
	m.ph.AuthRev, m.ph.AuthEnabled = a.Revision, a.Enabled
	if err := im.Advance(ctx, info.Revision); err != nil {
		return err
	}
	m.ph.Phase = "follow"
	m.sourceRev = info.Revision
	return m.flush(ctx)
}

// download saves the source's snapshot stream to a file, sha256 trailer
// included, for snapshot.Open to verify. It ends with ErrSourceIdle when
// the source sends nothing for the idle timeout, and with errNoSnapshot
// when the source answers that it serves no snapshot.
func (m *migration) download(ctx context.Context) (string, error) {
	f, err := os.CreateTemp(m.opts.TempDir, "engram-migrate-base-*.db")
	if err != nil {
		return "", fmt.Errorf("migrate: %w", err)
	}
	idle := newIdleWatch(ctx, m.opts.IdleTimeout)
	defer idle.stop()
	// Opening the stream waits for a connection too, so the watch runs
	// from before it.
	rc, err := m.opts.Client.Snapshot(idle.ctx)
	var n int64
	if err == nil {
		n, err = copyTouching(f, rc, idle)
		rc.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		if n == 0 && notSupported(err) {
			return "", fmt.Errorf("%w: %w", errNoSnapshot, err)
		}
		return "", fmt.Errorf("migrate: snapshot of the source (after %d bytes): %w", n, idle.err(err, "its snapshot"))
	}
	m.log.Info("downloaded the source's snapshot", "bytes", n, "file", filepath.Base(f.Name()))
	return f.Name(), nil
}

// copyTouching copies src to dst, touching idle with every chunk read.
func copyTouching(dst io.Writer, src io.Reader, idle *idleWatch) (int64, error) {
	buf := make([]byte, 256<<10)
	var n int64
	for {
		r, err := src.Read(buf)
		if r > 0 {
			idle.touch()
			w, werr := dst.Write(buf[:r])
			n += int64(w)
			if werr != nil {
				return n, werr
			}
		}
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
