package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"

	"github.com/engramkv/engram/core/kv"
)

func request(key string, size int64) *Request {
	r := NewRequest([]kv.Op{kv.Put([]byte(key), nil)})
	r.Size = size
	return r
}

// TestGroupsForm: the requests queued when the committer looks form its
// next group, in arrival order, ending at maxGroup requests or once they
// hold maxBytes; each caller gets its own answer.
func TestGroupsForm(t *testing.T) {
	q := NewQueue("test", 3, 25)
	reqs := []*Request{request("a", 20), request("b", 10), request("c", 10), request("d", 10), request("e", 10)}
	for _, r := range reqs {
		q.reqs <- r // queued before the committer runs, in this order
	}
	var groups [][]string
	go q.Run(func(group []*Request) {
		var names []string
		for _, r := range group {
			if r.Take() {
				names = append(names, string(r.Ops[0].Key))
				r.Result = fmt.Errorf("answer %s", r.Ops[0].Key)
				r.Reply()
			}
		}
		groups = append(groups, names)
	})
	for _, r := range reqs {
		if err := <-r.Done(); err == nil || err.Error() != "answer "+string(r.Ops[0].Key) {
			t.Errorf("%s answered %v", r.Ops[0].Key, err)
		}
	}
	q.Close()
	// a and b reach 30 bytes; c, d and e are three requests.
	if got, want := fmt.Sprint(groups), "[[a b] [c d e]]"; got != want {
		t.Errorf("groups %s, want %s", got, want)
	}
}

// TestAbandonedBeforeTaken: a caller whose context ends while its request is
// still queued is told it was not applied, and the committer leaves the
// request out.
func TestAbandonedBeforeTaken(t *testing.T) {
	q := NewQueue("test", 8, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- q.Submit(ctx, request("gone", 1)) }()
	for len(q.reqs) == 0 { // queued, and no committer runs yet
		runtime.Gosched()
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned request answered %v, want context.Canceled", err)
	}
	var took []string
	go q.Run(func(group []*Request) {
		for _, r := range group {
			if r.Take() {
				took = append(took, string(r.Ops[0].Key))
				r.Reply()
			}
		}
	})
	if err := q.Submit(ctx, request("late", 1)); !errors.Is(err, context.Canceled) {
		t.Errorf("submit with a done context: %v", err)
	}
	if err := q.Submit(context.Background(), request("after", 1)); err != nil {
		t.Fatal(err)
	}
	q.Close()
	if fmt.Sprint(took) != "[after]" {
		t.Errorf("committer took %v, want [after]", took)
	}
}
