package consistentlist

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/kubernetes"

	"k8s.io/apimachinery/pkg/api/apitesting"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/cacher"
	"k8s.io/apiserver/pkg/storage/etcd3"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"
	"k8s.io/utils/clock"

	"github.com/engramkv/engram/tests/k8s/internal/backend"
	"github.com/engramkv/engram/tests/k8s/internal/fixture"
)

func TestMain(m *testing.M) { fixture.Main(m) }

const etcdPrefix = "/registry"

// cached is one resource's storage stack as kube-apiserver builds it: an
// etcd3 store, a watch cache over it and the delegator in front.
type cached struct {
	prefix    string
	store     storage.Interface
	delegator *cacher.CacheDelegator
}

func podAttrs(obj runtime.Object) (labels.Set, fields.Set, error) {
	pod, ok := obj.(*example.Pod)
	if !ok {
		return nil, nil, fmt.Errorf("%T is not a pod", obj)
	}
	return pod.Labels, fields.Set{"metadata.name": pod.Name, "metadata.namespace": pod.Namespace}, nil
}

// newCached builds the stack for resource on client and waits until its
// cache is ready. Every stack on one client shares the client's watch
// stream, as every cache of one kube-apiserver does.
func newCached(tb testing.TB, client *kubernetes.Client, resource string) *cached {
	tb.Helper()
	prefix := "/" + resource + "/"
	codec := apitesting.TestCodec(fixture.Codecs, examplev1.SchemeGroupVersion)
	versioner := storage.APIObjectVersioner{}
	gr := schema.GroupResource{Resource: resource}
	compactor := etcd3.NewCompactor(client.Client, 0, clock.RealClock{}, nil)
	tb.Cleanup(compactor.Stop)
	st, err := etcd3.New(client, compactor, codec, fixture.NewPod, fixture.NewPodList,
		etcdPrefix, prefix, gr, identity.NewEncryptCheckTransformer(),
		etcd3.NewDefaultLeaseManagerConfig(), etcd3.NewDefaultDecoder(codec, versioner), versioner)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(st.Close)
	c, err := cacher.NewCacherFromConfig(cacher.Config{
		Storage:             st,
		Versioner:           versioner,
		GroupResource:       gr,
		EventsHistoryWindow: cacher.DefaultEventFreshDuration,
		ResourcePrefix:      prefix,
		KeyFunc:             func(obj runtime.Object) (string, error) { return storage.NamespaceKeyFunc(prefix, obj) },
		GetAttrsFunc:        podAttrs,
		NewFunc:             fixture.NewPod,
		NewListFunc:         fixture.NewPodList,
		Codec:               fixture.Codecs.LegacyCodec(examplev1.SchemeGroupVersion),
		Clock:               clock.RealClock{},
	})
	if err != nil {
		tb.Fatalf("NewCacherFromConfig(%s): %v", resource, err)
	}
	d := cacher.NewCacheDelegator(c, st)
	tb.Cleanup(func() {
		d.Stop()
		c.Stop()
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Wait(ctx); err != nil {
		tb.Fatalf("the %s cache never became ready: %v", resource, err)
	}
	return &cached{prefix: prefix, store: st, delegator: d}
}

// pod returns the i-th object of a resource: about 1 KiB stored, like a
// small pod.
func pod(i int) *example.Pod {
	return &example.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   fmt.Sprintf("ns-%02d", i%50),
			Name:        fmt.Sprintf("pod-%05d", i),
			Labels:      map[string]string{"app": fmt.Sprintf("app-%03d", i%200), "tier": "backend"},
			Annotations: map[string]string{"note": strings.Repeat("x", 700)},
		},
		Spec: example.PodSpec{NodeName: fmt.Sprintf("node-%03d", i%500), ServiceAccountName: "default"},
	}
}

func key(c *cached, p *example.Pod) string { return c.prefix + p.Namespace + "/" + p.Name }

// load creates n objects in c, a few at a time.
func load(tb testing.TB, c *cached, n int) {
	tb.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				p := pod(i)
				if err := c.store.Create(ctx, key(c, p), p, &example.Pod{}, 0); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		tb.Fatal(err)
	}
}

// update rewrites the i-th object of c, as a kubelet's heartbeat or a
// controller's status update does.
func update(ctx context.Context, c *cached, i int) error {
	p := pod(i)
	return c.store.GuaranteedUpdate(ctx, key(c, p), &example.Pod{}, false, nil,
		func(in runtime.Object, _ storage.ResponseMeta) (runtime.Object, *uint64, error) {
			out := in.(*example.Pod)
			out.Labels["beat"] = fmt.Sprint(time.Now().UnixNano())
			return out, nil, nil
		}, nil)
}

// list reads every object of c with consistent paginated lists of limit
// objects a page, as `kubectl get --chunk-size` does, and returns how many
// it got and how long the first page (the consistent read) took.
func list(ctx context.Context, c *cached, limit int64) (int, time.Duration, error) {
	n := 0
	var first time.Duration
	cont := ""
	for page := 0; ; page++ {
		start := time.Now()
		out := &example.PodList{}
		opts := storage.ListOptions{
			Recursive: true,
			Predicate: storage.SelectionPredicate{Label: labels.Everything(), Field: fields.Everything(), GetAttrs: podAttrs, Limit: limit, Continue: cont},
		}
		if err := c.delegator.GetList(ctx, c.prefix, opts, out); err != nil {
			return n, first, fmt.Errorf("page %d: %w", page, err)
		}
		if page == 0 {
			first = time.Since(start)
		}
		n += len(out.Items)
		if out.Continue == "" {
			return n, first, nil
		}
		cont = out.Continue
	}
}

// BenchmarkConsistentList times a full paginated consistent list (limit 500)
// of 5,000 pods served from the watch cache, while 100 writes/s go to
// another resource whose cache shares the watch stream, plus 10 more caches
// of idle resources on that stream. ms/op is the whole list;
// first-page-ms is the consistent read, which waits for the cache to catch
// up with the store's revision.
func BenchmarkConsistentList(b *testing.B) {
	const (
		pods      = 5000
		leases    = 500
		writeRate = 100 // writes per second to the leases
		idle      = 10
	)
	client := backend.Client(b)
	podCache := newCached(b, client, "pods")
	leaseCache := newCached(b, client, "leases")
	for i := range idle {
		newCached(b, client, fmt.Sprintf("idle%02d", i))
	}
	load(b, podCache, pods)
	load(b, leaseCache, leases)
	ctx, stop := context.WithCancel(context.Background())
	var writers sync.WaitGroup
	writers.Go(func() {
		// Exponential gaps (a Poisson stream), so the writes keep no
		// fixed phase to the cache's 100 ms progress requests.
		gaps := rand.New(rand.NewPCG(1, 2))
		for i := 0; ; i++ {
			gap := time.Duration(gaps.ExpFloat64() * float64(time.Second) / writeRate)
			select {
			case <-ctx.Done():
				return
			case <-time.After(gap):
			}
			if err := update(ctx, leaseCache, i%leases); err != nil && ctx.Err() == nil {
				b.Errorf("updating a lease: %v", err)
				return
			}
		}
	})
	defer func() {
		stop()
		writers.Wait()
	}()
	// The first list also waits for the cache to hold every pod.
	if n, _, err := list(ctx, podCache, 500); err != nil || n != pods {
		b.Fatalf("warm-up list: %d pods, %v", n, err)
	}
	var firsts []time.Duration
	b.ResetTimer()
	for b.Loop() {
		n, first, err := list(ctx, podCache, 500)
		if err != nil {
			b.Fatal(err)
		}
		if n != pods {
			b.Fatalf("listed %d pods, want %d", n, pods)
		}
		firsts = append(firsts, first)
	}
	b.StopTimer()
	sort.Slice(firsts, func(i, j int) bool { return firsts[i] < firsts[j] })
	b.ReportMetric(float64(firsts[len(firsts)/2].Microseconds())/1000, "first-page-p50-ms")
	b.ReportMetric(float64(firsts[len(firsts)*99/100].Microseconds())/1000, "first-page-p99-ms")
}
