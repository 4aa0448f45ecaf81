package sdk

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"unsafe"
)

// Logger returns a logger whose records go to the host's log (the Engram
// server's log/slog output, tagged with the plugin's name). Writing to
// stderr works too (the host logs it line by line at warn level); Logger keeps
// levels and attributes.
func Logger() *slog.Logger { return slog.New(&hostHandler{}) }

// hostHandler is a slog.Handler over the log import. It formats attributes
// as key=value text: the host wraps each message in its own structured
// record.
type hostHandler struct {
	prefix string // pre-formatted attributes from WithAttrs
	group  string
}

func (h *hostHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *hostHandler) Handle(_ context.Context, r slog.Record) error {
	var sb strings.Builder
	sb.WriteString(r.Message)
	sb.WriteString(h.prefix)
	r.Attrs(func(a slog.Attr) bool {
		writeAttr(&sb, h.group, a)
		return true
	})
	msg := sb.String()
	hostLog(int32(r.Level), unsafe.Pointer(unsafe.StringData(msg)), uint32(len(msg)))
	return nil
}

func (h *hostHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	var sb strings.Builder
	sb.WriteString(h.prefix)
	for _, a := range attrs {
		writeAttr(&sb, h.group, a)
	}
	return &hostHandler{prefix: sb.String(), group: h.group}
}

func (h *hostHandler) WithGroup(name string) slog.Handler {
	g := name
	if h.group != "" {
		g = h.group + "." + name
	}
	return &hostHandler{prefix: h.prefix, group: g}
}

func writeAttr(sb *strings.Builder, group string, a slog.Attr) {
	if a.Equal(slog.Attr{}) {
		return
	}
	sb.WriteByte(' ')
	if group != "" {
		sb.WriteString(group)
		sb.WriteByte('.')
	}
	fmt.Fprintf(sb, "%s=%v", a.Key, a.Value.Resolve())
}
