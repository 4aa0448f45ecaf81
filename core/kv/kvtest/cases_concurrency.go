package kvtest

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/engramkv/engram/core/kv"
)

// caseSnapshotIsolation runs writers that update, delete and insert keys
// inside the range of open iterators. An iterator opened before the writers
// started must yield exactly the state it was opened on, however long it is
// held; iterators opened while they run must see each writer's batches as a
// prefix of its history (atomic, and ordered after every Commit that had
// returned before Scan was called).
func caseSnapshotIsolation(ctx context.Context, t T, s kv.Store) {
	const (
		slots   = 1000 // even slots hold initial keys; odd slots are inserted
		writers = 2
		rounds  = 60
	)
	slot := func(i int) []byte { return key("snap/%05d", i) }
	m := model{}
	for i := 0; i < slots; i++ {
		m[string(slot(2*i))] = []byte("v0")
	}
	load(ctx, t, s, m, 250)
	rangeOpts := kv.ScanOptions{Start: []byte("snap/"), End: []byte("snap0")}
	initial := m.scan(rangeOpts)

	// Writer w, round j: update one initial key, delete another, insert a
	// new one, all in one batch.
	type effect struct{ upd, del, ins []byte }
	eff := func(w, j int) effect {
		return effect{
			upd: slot(2 * (w + writers*(2*j))),
			del: slot(2 * (w + writers*(2*j+1))),
			ins: slot(2*(w+writers*j) + 1),
		}
	}
	tag := func(w, j int) []byte { return key("w%d-%d", w, j) }

	held := make([]kv.Iterator, 0, 2)
	defer func() {
		for _, it := range held {
			_ = it.Close()
		}
	}()
	open := func(o kv.ScanOptions) kv.Iterator {
		it, err := s.Scan(ctx, o)
		if err != nil {
			t.Fatalf("Scan%s: %v", showOpts(o), err)
		}
		held = append(held, it)
		return it
	}
	fwd := rangeOpts
	fwd.BatchSize = 16
	rev := rangeOpts
	rev.BatchSize, rev.Reverse = 16, true
	itF, itR := open(fwd), open(rev)
	// Consume a first batch before any write, so the snapshot is not
	// lazily taken on the first Next.
	firstF, errF := itF.Next(ctx)
	firstR, errR := itR.Next(ctx)
	if errF != nil || errR != nil || len(firstF) == 0 || len(firstR) == 0 {
		t.Fatalf("first Next: %d pairs, %v; %d pairs, %v", len(firstF), errF, len(firstR), errR)
	}

	var committed, started [writers]atomic.Int64
	var wg sync.WaitGroup
	// If a check below stops the case, the writers must finish before the
	// case returns: reporting after the end of a test panics.
	defer wg.Wait()
	for w := range writers {
		spawn(t, &wg, func() {
			for j := range rounds {
				e := eff(w, j)
				started[w].Store(int64(j + 1))
				err := s.Commit(ctx, []kv.Op{
					kv.CompareAndSwap(e.upd, []byte("v0"), tag(w, j)),
					kv.Delete(e.del),
					kv.PutIfAbsent(e.ins, tag(w, j)),
				})
				if err != nil {
					t.Errorf("writer %d round %d: %v", w, j, err)
					return
				}
				committed[w].Store(int64(j + 1))
			}
		})
	}

	// visible checks one snapshot and returns how many batches of each
	// writer it contains.
	visible := func(got []kv.Pair, lo, hi [writers]int64) {
		t.Helper()
		state := make(map[string][]byte, len(got))
		for _, p := range got {
			state[string(p.Key)] = p.Value
		}
		for w := range writers {
			n := int64(0)
			for j := range rounds {
				e := eff(w, j)
				seen := 0
				if bytes.Equal(state[string(e.upd)], tag(w, j)) {
					seen++
				}
				if _, ok := state[string(e.del)]; !ok {
					seen++
				}
				if bytes.Equal(state[string(e.ins)], tag(w, j)) {
					seen++
				}
				switch {
				case seen == 3 && int64(j) == n:
					n++
				case seen == 0:
				default:
					t.Errorf("writer %d batch %d: %d of 3 effects visible (or out of order, %d batches before it)", w, j, seen, n)
				}
			}
			if n < lo[w] || n > hi[w] {
				t.Errorf("writer %d: snapshot shows %d batches, want between %d (returned before Scan) and %d (started before Scan returned)", w, n, lo[w], hi[w])
			}
		}
	}

	// Interleave: drain the old iterators slowly while fresh snapshots are
	// taken and checked, until the writers are done.
	restF, restR := firstF, firstR
	for step := 0; ; step++ {
		var lo, hi [writers]int64
		for w := range writers {
			lo[w] = committed[w].Load()
		}
		it, err := s.Scan(ctx, rangeOpts)
		if err != nil {
			t.Fatalf("concurrent Scan: %v", err)
		}
		for w := range writers {
			hi[w] = started[w].Load()
		}
		got, err := drain(ctx, it, rangeOpts)
		_ = it.Close()
		if err != nil {
			t.Fatalf("concurrent scan: %v", err)
		}
		visible(got, lo, hi)

		if b, err := itF.Next(ctx); err != nil {
			t.Fatalf("held forward iterator: %v", err)
		} else {
			restF = append(restF, b...)
		}
		if b, err := itR.Next(ctx); err != nil {
			t.Fatalf("held reverse iterator: %v", err)
		} else {
			restR = append(restR, b...)
		}
		done := true
		for w := range writers {
			done = done && committed[w].Load() == rounds
		}
		if done || step > 10000 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("writers did not finish: %v", ctx.Err())
		}
	}
	wg.Wait()
	for _, held := range []struct {
		it   kv.Iterator
		got  []kv.Pair
		opts kv.ScanOptions
	}{{itF, restF, fwd}, {itR, restR, rev}} {
		rest, err := drain(ctx, held.it, held.opts)
		if err != nil {
			t.Fatalf("held iterator: %v", err)
		}
		got := append(held.got, rest...)
		want := initial
		if held.opts.Reverse {
			want = m.scan(kv.ScanOptions{Start: rangeOpts.Start, End: rangeOpts.End, Reverse: true})
		}
		if diff := diffPairs(got, want); diff != "" {
			t.Errorf("iterator opened before the writers (reverse=%v) saw their writes: %s", held.opts.Reverse, diff)
		}
	}
	// After the writers, every batch is visible to a new snapshot.
	var all [writers]int64
	for w := range writers {
		all[w] = rounds
	}
	visible(scanAll(ctx, t, s, rangeOpts), all, all)
}

// caseConcurrentCAS increments one counter from many goroutines with
// read-CAS-retry loops. Every successful CAS must land exactly once: a lost
// update or a double apply shows up in the final count.
func caseConcurrentCAS(ctx context.Context, t T, s kv.Store) {
	const goroutines, perG = 8, 25
	counter := []byte("cas/counter")
	mustCommit(ctx, t, s, kv.Put(counter, []byte("0")))
	var wg sync.WaitGroup
	var successes, conflicts atomic.Int64
	for g := range goroutines {
		spawn(t, &wg, func() {
			v, err := s.Get(ctx, counter)
			if err != nil {
				t.Errorf("goroutine %d: Get: %v", g, err)
				return
			}
			for done := 0; done < perG; {
				n, err := strconv.Atoi(string(v))
				if err != nil {
					t.Errorf("goroutine %d: counter holds %q", g, v)
					return
				}
				next := []byte(strconv.Itoa(n + 1))
				// A private key per increment makes a lost or duplicated
				// batch visible even if the counter happened to add up.
				mark := key("cas/mark/%d/%d", g, done)
				err = s.Commit(ctx, []kv.Op{kv.CompareAndSwap(counter, v, next), kv.PutIfAbsent(mark, next)})
				if c, ok := kv.AsConflict(err); ok {
					if c.Index != 0 || !c.Exists || bytes.Equal(c.Current, v) {
						t.Errorf("goroutine %d: bad conflict for expected %q: index %d exists %v current %q", g, v, c.Index, c.Exists, c.Current)
						return
					}
					conflicts.Add(1)
					v = c.Current
					continue
				}
				if err != nil {
					t.Errorf("goroutine %d: Commit: %v", g, err)
					return
				}
				successes.Add(1)
				v = next
				done++
			}
		})
	}
	wg.Wait()
	total := goroutines * perG
	expectValue(ctx, t, s, counter, []byte(strconv.Itoa(total)))
	if got := successes.Load(); got != int64(total) {
		t.Errorf("%d successful increments, want %d", got, total)
	}
	marks := scanAll(ctx, t, s, kv.ScanOptions{Start: []byte("cas/mark/"), End: []byte("cas/mark0")})
	if len(marks) != total {
		t.Errorf("%d increment marks, want %d", len(marks), total)
	}
	seen := make(map[string]bool, total)
	for _, p := range marks {
		if seen[string(p.Value)] {
			t.Errorf("two increments both produced counter value %q", p.Value)
		}
		seen[string(p.Value)] = true
	}
	t.Logf("%d increments, %d conflicts", successes.Load(), conflicts.Load())
}

func caseConcurrentPutIfAbsent(ctx context.Context, t T, s kv.Store) {
	const goroutines = 16
	for round := range 3 {
		k := key("race/%d", round)
		var wg sync.WaitGroup
		winners := make(chan int, goroutines)
		currents := make(chan []byte, goroutines)
		start := make(chan struct{})
		for g := range goroutines {
			spawn(t, &wg, func() {
				<-start
				err := s.Commit(ctx, []kv.Op{kv.PutIfAbsent(k, key("g%d", g))})
				if c, ok := kv.AsConflict(err); ok && c.Exists {
					currents <- c.Current
					return
				}
				if err != nil {
					t.Errorf("goroutine %d: Commit = %v, want nil or a conflict with Exists", g, err)
					return
				}
				winners <- g
			})
		}
		close(start)
		wg.Wait()
		close(winners)
		close(currents)
		var ws []int
		for w := range winners {
			ws = append(ws, w)
		}
		if len(ws) != 1 {
			t.Fatalf("round %d: %d goroutines won PutIfAbsent, want exactly 1 (%v)", round, len(ws), ws)
		}
		want := key("g%d", ws[0])
		expectValue(ctx, t, s, k, want)
		for c := range currents {
			if !bytes.Equal(c, want) {
				t.Errorf("round %d: loser saw Current %q, want the winner's %q", round, c, want)
			}
		}
	}
}

// caseConcurrentWriters commits disjoint batches from many goroutines; each
// must be fully applied, and nothing else.
func caseConcurrentWriters(ctx context.Context, t T, s kv.Store) {
	const goroutines, perG = 16, 15
	var wg sync.WaitGroup
	for g := range goroutines {
		spawn(t, &wg, func() {
			for i := range perG {
				err := s.Commit(ctx, []kv.Op{
					kv.Put(key("cw/%02d/%02d/a", g, i), key("%d", i)),
					kv.Put(key("cw/%02d/%02d/b", g, i), key("%d", i)),
					kv.Delete(key("cw/%02d/%02d/a", g, i-1)),
				})
				if err != nil {
					t.Errorf("goroutine %d batch %d: %v", g, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	m := model{}
	for g := range goroutines {
		for i := range perG {
			m[fmt.Sprintf("cw/%02d/%02d/b", g, i)] = key("%d", i)
		}
		m[fmt.Sprintf("cw/%02d/%02d/a", g, perG-1)] = key("%d", perG-1)
	}
	expectScan(ctx, t, s, kv.ScanOptions{}, m.scan(kv.ScanOptions{}))
}

// caseReadYourWrites checks that a Commit is visible to every read that
// starts after it returns, on this goroutine and on any other one that
// learns of the Commit through a channel.
func caseReadYourWrites(ctx context.Context, t T, s kv.Store) {
	k := []byte("ryw/k")
	notify := make(chan []byte)
	ack := make(chan struct{})
	go func() {
		defer close(ack)
		for v := range notify {
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Errorf("panic reading back: %v", p)
					}
				}()
				readBack(ctx, t, s, k, v)
			}()
			// Acknowledge only after both reads, so that the next Commit
			// cannot overtake them.
			ack <- struct{}{}
		}
	}()
	for i := range 100 {
		v := key("%d", i)
		mustCommit(ctx, t, s, kv.Put(k, v))
		expectValue(ctx, t, s, k, v)
		expectScan(ctx, t, s, kv.ScanOptions{Start: k, Limit: 1}, []kv.Pair{{Key: k, Value: v}})
		notify <- v
		<-ack
	}
	close(notify)
	<-ack
	mustCommit(ctx, t, s, kv.Delete(k))
	expectAbsent(ctx, t, s, k)
	expectScan(ctx, t, s, kv.ScanOptions{}, nil)
}

// readBack runs on a goroutine other than the committer's, so it reports
// with Errorf only.
func readBack(ctx context.Context, t T, s kv.Store, k, v []byte) {
	got, err := s.Get(ctx, k)
	if err != nil || !bytes.Equal(got, v) {
		t.Errorf("other goroutine: Get after Commit = %q, %v; want %q", got, err, v)
	}
	o := kv.ScanOptions{Start: k, Reverse: true}
	it, err := s.Scan(ctx, o)
	if err != nil {
		t.Errorf("other goroutine: Scan: %v", err)
		return
	}
	defer it.Close()
	ps, err := drain(ctx, it, o)
	if err != nil || len(ps) != 1 || !bytes.Equal(ps[0].Value, v) {
		t.Errorf("other goroutine: Scan after Commit = %s, %v; want %q", showPairs(ps), err, v)
	}
}
