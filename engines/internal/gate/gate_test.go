package gate

import (
	"errors"
	"testing"

	"github.com/engramkv/engram/core/kv"
)

// TestCloseWaitsAndShutsOut: Close runs shut once, after the call in
// flight exits; later calls and a second Close get kv.ErrClosed.
func TestCloseWaitsAndShutsOut(t *testing.T) {
	var g Gate
	if err := g.Enter(); err != nil {
		t.Fatalf("Enter on an open gate: %v", err)
	}
	var events []string
	closed := make(chan error)
	go func() {
		closed <- g.Close(func() error {
			events = append(events, "shut")
			return errors.New("shut failed")
		})
	}()
	events = append(events, "exit") // Close cannot run shut before Exit
	g.Exit()
	if err := <-closed; err == nil || err.Error() != "shut failed" {
		t.Fatalf("Close = %v, want shut's error", err)
	}
	if len(events) != 2 || events[0] != "exit" || events[1] != "shut" {
		t.Fatalf("events %v, want [exit shut]", events)
	}
	if err := g.Enter(); !errors.Is(err, kv.ErrClosed) {
		t.Fatalf("Enter after Close = %v, want kv.ErrClosed", err)
	}
	if err := g.Close(func() error { t.Error("shut ran twice"); return nil }); !errors.Is(err, kv.ErrClosed) {
		t.Fatalf("second Close = %v, want kv.ErrClosed", err)
	}
}

// TestEnterKey: an empty key is not found and leaves the gate as it was
// (Close does not wait for it); any other key enters; a closed gate
// answers kv.ErrClosed before looking at the key.
func TestEnterKey(t *testing.T) {
	var g Gate
	if err := g.EnterKey(nil); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("EnterKey(empty) = %v, want kv.ErrNotFound", err)
	}
	if err := g.EnterKey([]byte("k")); err != nil {
		t.Fatalf("EnterKey(k) on an open gate: %v", err)
	}
	g.Exit()
	if err := g.Close(nil); err != nil {
		t.Fatalf("Close after the calls exited: %v", err)
	}
	if err := g.EnterKey(nil); !errors.Is(err, kv.ErrClosed) {
		t.Fatalf("EnterKey(empty) on a closed gate = %v, want kv.ErrClosed", err)
	}
}
