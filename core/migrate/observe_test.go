package migrate_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/engramkv/engram/core/migrate"
)

// logBuffer collects a migration's log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// hookHandler is a slog handler that writes to w and calls hook, in the
// logging goroutine, on the first record whose message starts with prefix:
// a test acts at an exact point of a migration that way (the migration
// waits while the hook runs).
type hookHandler struct {
	slog.Handler
	prefix string
	once   *sync.Once
	hook   func()
}

func newHookLogger(w *logBuffer, prefix string, hook func()) *slog.Logger {
	return slog.New(hookHandler{Handler: slog.NewTextHandler(w, nil), prefix: prefix, once: &sync.Once{}, hook: hook})
}

func (h hookHandler) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	if strings.HasPrefix(r.Message, h.prefix) {
		h.once.Do(h.hook)
	}
	return err
}

func (h hookHandler) WithAttrs(as []slog.Attr) slog.Handler {
	h.Handler = h.Handler.WithAttrs(as)
	return h
}

func (h hookHandler) WithGroup(name string) slog.Handler {
	h.Handler = h.Handler.WithGroup(name)
	return h
}

// progressLog records a migration's progress reports and, with the
// source's latest acknowledged revision, how far behind it was.
type progressLog struct {
	mu      sync.Mutex
	reports []migrate.Progress
	// behind: the writers' latest acknowledged revision minus Applied, at
	// each follow-phase report made while acked was set.
	behind []int64
	acked  func() int64
	notify chan struct{}
}

func newProgressLog(acked func() int64) *progressLog {
	return &progressLog{acked: acked, notify: make(chan struct{}, 1)}
}

func (p *progressLog) record(pr migrate.Progress) {
	p.mu.Lock()
	p.reports = append(p.reports, pr)
	if p.acked != nil && pr.Phase == "follow" {
		if a := p.acked(); a > 0 {
			p.behind = append(p.behind, max(a-pr.Applied, 0))
		}
	}
	p.mu.Unlock()
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

// waitFor waits until a report satisfies ok, or ctx ends.
func (p *progressLog) waitFor(ctx context.Context, ok func(migrate.Progress) bool) (migrate.Progress, error) {
	for {
		p.mu.Lock()
		for _, r := range p.reports {
			if ok(r) {
				p.mu.Unlock()
				return r, nil
			}
		}
		n := len(p.reports)
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return migrate.Progress{}, fmt.Errorf("no such progress report among %d: %w", n, ctx.Err())
		case <-p.notify:
		}
	}
}

func (p *progressLog) snapshot() ([]migrate.Progress, []int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.reports), slices.Clone(p.behind)
}
