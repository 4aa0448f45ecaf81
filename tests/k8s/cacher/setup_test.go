package cacher

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/kubernetes"

	"k8s.io/apimachinery/pkg/api/apitesting"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/cacher"
	"k8s.io/apiserver/pkg/storage/etcd3"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/engramkv/engram/tests/k8s/internal/backend"
	"github.com/engramkv/engram/tests/k8s/internal/fixture"
)

// resourcePrefix is where the cached resource lives, under the default
// --etcd-prefix /registry.
const (
	etcdPrefix     = "/registry"
	resourcePrefix = "/pods/"
)

// env is one test's cached storage over a fresh server.
type env struct {
	ctx       context.Context
	delegator *cacher.CacheDelegator // what the tests talk to
	cacher    *cacher.Cacher
	etcd      storage.Interface // the etcd3 store under the cache
	client    *kubernetes.Client
}

type options struct {
	transformer  value.Transformer
	codec        runtime.Codec
	keyFunc      func(runtime.Object) (string, error)
	indexerFuncs storage.IndexerFuncs
	indexers     cache.Indexers
}

type option func(*options)

func TestMain(m *testing.M) { fixture.Main(m) }

// failingReads is the store's transformer and codec for the tests of objects
// the store cannot read: while fail is set, every read (transform or
// decode, whichever the test chose) fails.
type failingReads struct {
	value.Transformer
	runtime.Codec
	fail atomic.Bool
}

func (f *failingReads) setFailing(on bool) { f.fail.Store(on) }

func (f *failingReads) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	if f.fail.Load() {
		return nil, false, errors.New("untransformable (test)")
	}
	return f.Transformer.TransformFromStorage(ctx, data, dataCtx)
}

func (f *failingReads) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if f.fail.Load() {
		return nil, nil, errors.New("undecodable (test)")
	}
	return f.Codec.Decode(data, defaults, into)
}

// failingTransformer gives the store a transformer whose reads fail on demand.
func failingTransformer() (option, func(bool)) {
	f := &failingReads{Transformer: identity.NewEncryptCheckTransformer()}
	return func(o *options) { o.transformer = f }, f.setFailing
}

// failingCodec gives the store a codec whose decodes fail on demand.
func failingCodec() (option, func(bool)) {
	f := &failingReads{Codec: apitesting.TestCodec(fixture.Codecs, examplev1.SchemeGroupVersion)}
	return func(o *options) { o.codec = f }, f.setFailing
}

// clusterScoped stores pods without a namespace in the key.
func clusterScoped(o *options) {
	o.keyFunc = func(obj runtime.Object) (string, error) { return storage.NoNamespaceKeyFunc(resourcePrefix, obj) }
}

// nodeNameAndNamespaceIndexes configures the indexes kube-apiserver's pod
// registry gives the watch cache (spec.nodeName for watchers; spec.nodeName
// and metadata.namespace for lists).
func nodeNameAndNamespaceIndexes(o *options) {
	o.indexerFuncs = storage.IndexerFuncs{
		"spec.nodeName": func(obj runtime.Object) string {
			if pod, ok := obj.(*example.Pod); ok {
				return pod.Spec.NodeName
			}
			return ""
		},
	}
	o.indexers = cache.Indexers{
		"f:spec.nodeName":      func(obj any) ([]string, error) { return []string{obj.(*example.Pod).Spec.NodeName}, nil },
		"f:metadata.namespace": func(obj any) ([]string, error) { return []string{obj.(*example.Pod).Namespace}, nil },
	}
}

// podAttrs gives the cache the labels and the selectable fields of a pod.
func podAttrs(obj runtime.Object) (labels.Set, fields.Set, error) {
	pod, ok := obj.(*example.Pod)
	if !ok {
		return nil, nil, fmt.Errorf("%T is not a pod", obj)
	}
	return pod.Labels, fields.Set{
		"metadata.name":      pod.Name,
		"metadata.namespace": pod.Namespace,
		"spec.nodeName":      pod.Spec.NodeName,
		"spec.restartPolicy": string(pod.Spec.RestartPolicy),
		"status.phase":       string(pod.Status.Phase),
	}, nil
}

// setup builds the storage stack kube-apiserver uses for a cached resource:
// an etcd3 store on a fresh server, a watch cache over it and the delegator
// that routes each request to one or the other. As upstream does, the first
// LIST the cache's reflector sends fails once (unless the reflector uses
// WatchList), so the relist path is exercised too.
func setup(t testing.TB, opts ...option) *env {
	t.Helper()
	o := options{
		transformer: identity.NewEncryptCheckTransformer(),
		codec:       apitesting.TestCodec(fixture.Codecs, examplev1.SchemeGroupVersion),
		keyFunc:     func(obj runtime.Object) (string, error) { return storage.NamespaceKeyFunc(resourcePrefix, obj) },
	}
	for _, opt := range opts {
		opt(&o)
	}

	client := backend.Client(t)
	codec := o.codec
	versioner := storage.APIObjectVersioner{}
	compactor := etcd3.NewCompactor(client.Client, 0, clock.RealClock{}, nil)
	t.Cleanup(compactor.Stop)
	etcdStore, err := etcd3.New(client, compactor, codec, fixture.NewPod, fixture.NewPodList,
		etcdPrefix, resourcePrefix, schema.GroupResource{Resource: "pods"},
		o.transformer, etcd3.NewDefaultLeaseManagerConfig(),
		etcd3.NewDefaultDecoder(codec, versioner), versioner)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcdStore.Close)

	listErrors := 1
	if clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient) {
		listErrors = 0
	}
	flaky := &storagetesting.StorageInjectingListErrors{Interface: etcdStore, Errors: listErrors}

	c, err := cacher.NewCacherFromConfig(cacher.Config{
		Storage:             flaky,
		Versioner:           versioner,
		GroupResource:       schema.GroupResource{Resource: "pods"},
		EventsHistoryWindow: cacher.DefaultEventFreshDuration,
		ResourcePrefix:      resourcePrefix,
		KeyFunc:             o.keyFunc,
		GetAttrsFunc:        podAttrs,
		NewFunc:             fixture.NewPod,
		NewListFunc:         fixture.NewPodList,
		IndexerFuncs:        o.indexerFuncs,
		Indexers:            &o.indexers,
		Codec:               fixture.Codecs.LegacyCodec(examplev1.SchemeGroupVersion),
		Clock:               clock.RealClock{},
	})
	if err != nil {
		t.Fatalf("NewCacherFromConfig: %v", err)
	}
	ctx := context.Background()
	// The tests expect GetList not to fail: wait for the injected error to
	// be used up, then for the cache to be initialised (Get, GetList and
	// Watch answer 429 before that).
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, wait.ForeverTestTimeout, true,
		func(context.Context) (bool, error) { return flaky.ErrorsConsumed() }); err != nil {
		t.Fatalf("the cache never listed: %v", err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, wait.ForeverTestTimeout)
	defer cancel()
	if err := c.Wait(waitCtx); err != nil {
		t.Fatalf("the cache never became ready: %v", err)
	}
	d := cacher.NewCacheDelegator(c, flaky)
	t.Cleanup(func() {
		d.Stop()
		c.Stop()
	})
	return &env{ctx: ctx, delegator: d, cacher: c, etcd: etcdStore, client: client}
}

func (e *env) increaseRV() storagetesting.IncreaseRVFunc { return fixture.IncreaseRV(e.client.Client) }

// compaction compacts the server like the apiserver's compactor does and
// then makes the cache drop its snapshots below the compacted revision. The
// cache's own compactor would do the latter on its next 15s poll of the
// store's compact revision; doing it here keeps the tests fast.
func (e *env) compaction() storagetesting.Compaction {
	return func(ctx context.Context, t *testing.T, resourceVersion string) {
		rev := fixture.Compact(ctx, t, e.client.Client, resourceVersion)
		if !utilfeature.DefaultFeatureGate.Enabled(features.ListFromCacheSnapshot) {
			return // no snapshots, no cache compactor
		}
		fixture.WaitFor(ctx, t, "the etcd3 store to observe the compaction", func() bool {
			return e.etcd.CompactRevision() == rev
		})
		if err := e.cacher.Compact(resourceVersion); err != nil {
			t.Fatal(err)
		}
	}
}

// compactionObservedByCache is compaction plus waiting until the cache's
// compactor has polled the new compact revision (up to its 15s period), for
// the test that checks the delegator's CompactRevision.
func (e *env) compactionObservedByCache() storagetesting.Compaction {
	compact := e.compaction()
	return func(ctx context.Context, t *testing.T, resourceVersion string) {
		compact(ctx, t, resourceVersion)
		rev, err := storage.APIObjectVersioner{}.ParseResourceVersion(resourceVersion)
		if err != nil {
			t.Fatal(err)
		}
		fixture.WaitFor(ctx, t, "the cache to observe the compaction", func() bool {
			return e.delegator.CompactRevision() == int64(rev)
		})
	}
}

// syncedCreates makes Create return only once the cache serves the created
// object, for the watch-semantics tests that create objects and then watch
// from the cache.
type syncedCreates struct {
	*cacher.CacheDelegator
}

func (s syncedCreates) Create(ctx context.Context, key string, obj, out runtime.Object, ttl uint64) error {
	if err := s.CacheDelegator.Create(ctx, key, obj, out, ttl); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, wait.ForeverTestTimeout, true, func(ctx context.Context) (bool, error) {
		cached := fixture.NewPod()
		err := s.CacheDelegator.Get(ctx, key, storage.GetOptions{ResourceVersion: "0"}, cached)
		if storage.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return apiequality.Semantic.DeepEqual(cached, out), nil
	})
}
