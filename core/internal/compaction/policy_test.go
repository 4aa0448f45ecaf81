package compaction

import (
	"testing"
	"time"
)

func TestPeriodicTargetsTheRevisionRetentionAgo(t *testing.T) {
	p := Policy{Mode: Periodic, Retention: time.Hour}
	var s sampler
	t0 := time.Unix(0, 0)
	if got := p.target(&s, t0, 100); got != 0 {
		t.Fatalf("no history yet: target %d", got)
	}
	if got := p.target(&s, t0.Add(30*time.Minute), 200); got != 0 {
		t.Fatalf("half the retention: target %d", got)
	}
	if got := p.target(&s, t0.Add(time.Hour), 300); got != 100 {
		t.Fatalf("after an hour: target %d, want the revision an hour ago (100)", got)
	}
	if got := p.target(&s, t0.Add(95*time.Minute), 400); got != 200 {
		t.Fatalf("after 95 minutes: target %d, want 200", got)
	}
}

func TestRevisionTarget(t *testing.T) {
	p := Policy{Mode: Revision, Revisions: 1000}
	if got := p.target(nil, time.Now(), 5000); got != 4000 {
		t.Fatalf("target %d", got)
	}
}

func TestValidate(t *testing.T) {
	for _, p := range []Policy{{Mode: "daily"}, {Mode: Periodic}, {Mode: Revision}} {
		if p.Validate() == nil {
			t.Errorf("%+v validated", p)
		}
	}
	if err := (Policy{}).Validate(); err != nil {
		t.Error(err)
	}
}
