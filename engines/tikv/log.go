package tikv

import (
	"context"
	"log/slog"
	"slices"

	pingcaplog "github.com/pingcap/log"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// routeClientLogs points client-go's and the PD client's process-wide zap
// logger (github.com/pingcap/log) at l. By default that logger writes
// info-level chatter to stdout, which would interleave with Engram's own
// structured logs.
func routeClientLogs(l *slog.Logger) {
	core := slogCore{l: l}
	props := &pingcaplog.ZapProperties{
		Core:   core,
		Syncer: zapcore.AddSync(discard{}),
		Level:  zap.NewAtomicLevelAt(zapcore.DebugLevel),
	}
	pingcaplog.ReplaceGlobals(zap.New(core), props)
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// slogCore is a zapcore.Core that forwards entries to slog. client-go logs
// routine events (region cache reloads, lock resolution, PD reconnects) at
// info level; they become debug.
type slogCore struct {
	l     *slog.Logger
	attrs []slog.Attr
}

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l >= zapcore.ErrorLevel:
		return slog.LevelError
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	default:
		return slog.LevelDebug
	}
}

func (c slogCore) Enabled(l zapcore.Level) bool {
	return c.l.Enabled(context.Background(), slogLevel(l))
}

func (c slogCore) With(fields []zapcore.Field) zapcore.Core {
	return slogCore{l: c.l, attrs: append(slices.Clip(c.attrs), fieldAttrs(fields)...)}
}

func (c slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	attrs := append(slices.Clip(c.attrs), fieldAttrs(fields)...)
	if e.LoggerName != "" {
		attrs = append(attrs, slog.String("logger", e.LoggerName))
	}
	c.l.LogAttrs(context.Background(), slogLevel(e.Level), e.Message, attrs...)
	return nil
}

func (c slogCore) Sync() error { return nil }

// fieldAttrs renders zap fields through zap's own map encoder, which knows
// every field type, in the order they were given.
func fieldAttrs(fields []zapcore.Field) []slog.Attr {
	if len(fields) == 0 {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	attrs := make([]slog.Attr, 0, len(fields))
	for _, f := range fields {
		f.AddTo(enc)
		if v, ok := enc.Fields[f.Key]; ok {
			attrs = append(attrs, slog.Any(f.Key, v))
		}
	}
	return attrs
}
