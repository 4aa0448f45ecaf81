package etcd3

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"

	"k8s.io/apimachinery/pkg/api/apitesting"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/utils/clock"

	"github.com/engramkv/engram/tests/k8s/internal/backend"
	"github.com/engramkv/engram/tests/k8s/internal/fixture"
)

func TestMain(m *testing.M) { fixture.Main(m) }

// valuePrefix is what the test transformer prepends to every stored value;
// the suite checks that values in the server carry it.
const valuePrefix = "test!"

// env is one test's storage: an etcd3 store over a fresh server.
type env struct {
	ctx    context.Context
	store  storage.Interface
	client *kubernetes.Client
	// rpcs records the Range and RangeStream RPCs the client sent.
	rpcs  *backend.RangeRPCs
	codec *failingCodec
	// prefixTransformer is the test transformer the store was built with
	// (it counts reads); transformer is what the store actually calls and
	// lets tests swap in a modified or failing one.
	prefixTransformer *storagetesting.PrefixTransformer
	transformer       *swappableTransformer
	// failReads makes every read of the transformer fail while set.
	failReads atomic.Bool
}

type options struct {
	endpoint       string // a running server to use instead of a fresh one
	prefix         string
	resourcePrefix string
	leaseConfig    etcd3.LeaseManagerConfig
}

type option func(*options)

func withEndpoint(ep string) option      { return func(o *options) { o.endpoint = ep } }
func withPrefix(p string) option         { return func(o *options) { o.prefix = p } }
func withResourcePrefix(p string) option { return func(o *options) { o.resourcePrefix = p } }

// setup starts a fresh server and builds the store kube-apiserver would use
// for "pods" on it, configured like the upstream etcd3 tests: example Pod
// codec, no key prefix, resource prefix /pods/, a prefix transformer, a
// compactor that never runs on its own (interval 0; it only watches
// compact_rev_key), and a lease manager that reuses leases for 1s.
func setup(t testing.TB, opts ...option) *env {
	t.Helper()
	o := options{resourcePrefix: "/pods/", leaseConfig: etcd3.NewDefaultLeaseManagerConfig()}
	// The default reuse window (60s) exceeds the 30s the suite waits for TTL
	// expiry; the upstream tests shorten it to 1s.
	o.leaseConfig.ReuseDurationSeconds = 1
	for _, opt := range opts {
		opt(&o)
	}

	fixture.FreshFeatureSupport(t)
	var client *kubernetes.Client
	var rpcs *backend.RangeRPCs
	if o.endpoint != "" {
		client, rpcs = backend.Dial(t, o.endpoint)
	} else {
		client, rpcs = backend.ClientRecordingRanges(t)
	}
	codec := &failingCodec{Codec: apitesting.TestCodec(fixture.Codecs, examplev1.SchemeGroupVersion)}
	pt := storagetesting.NewPrefixTransformer([]byte(valuePrefix), false)
	e := &env{ctx: context.Background(), client: client, rpcs: rpcs, codec: codec, prefixTransformer: pt}
	e.transformer = &swappableTransformer{current: pt, fail: &e.failReads}
	versioner := storage.APIObjectVersioner{}

	compactor := etcd3.NewCompactor(client.Client, 0, clock.RealClock{}, nil)
	t.Cleanup(compactor.Stop)
	s, err := etcd3.New(client, compactor, codec, fixture.NewPod, fixture.NewPodList,
		o.prefix, o.resourcePrefix, schema.GroupResource{Resource: "pods"}, e.transformer,
		o.leaseConfig, etcd3.NewDefaultDecoder(codec, versioner), versioner)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	e.store = s
	return e
}

// failingCodec is the store's codec; while fail is set every Decode fails,
// as for an object stored in a form the apiserver cannot read.
type failingCodec struct {
	runtime.Codec
	fail atomic.Bool
}

func (c *failingCodec) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if c.fail.Load() {
		return nil, nil, errors.New("undecodable (test)")
	}
	return c.Codec.Decode(data, defaults, into)
}

func (c *failingCodec) setFailing(on bool) { c.fail.Store(on) }
func (e *env) setReadsFailing(on bool)     { e.failReads.Store(on) }

// swappableTransformer is the transformer handed to etcd3.New. The store and
// its watcher both call it, so replacing the transformer it delegates to
// affects both at once, which is what the suite's transformer hooks need.
type swappableTransformer struct {
	mu      sync.RWMutex
	current value.Transformer
	fail    *atomic.Bool // every read fails while set
}

func (s *swappableTransformer) get() value.Transformer {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.current
}

// swap installs next and returns a func restoring the previous transformer.
func (s *swappableTransformer) swap(next value.Transformer) (restore func()) {
	s.mu.Lock()
	prev := s.current
	s.current = next
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.current = prev
		s.mu.Unlock()
	}
}

func (s *swappableTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	if s.fail.Load() {
		return nil, false, errors.New("untransformable (test)")
	}
	return s.get().TransformFromStorage(ctx, data, dataCtx)
}

func (s *swappableTransformer) TransformToStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, error) {
	return s.get().TransformToStorage(ctx, data, dataCtx)
}

// prefixTransformerStore implements storagetesting.InterfaceWithPrefixTransformer.
type prefixTransformerStore struct {
	storage.Interface
	e *env
}

func (e *env) withPrefixTransformer() *prefixTransformerStore {
	return &prefixTransformerStore{Interface: e.store, e: e}
}

func (s *prefixTransformerStore) UpdatePrefixTransformer(modify storagetesting.PrefixTransformerModifier) func() {
	// Modify a copy so the original keeps its settings for the restore.
	cp := *s.e.prefixTransformer
	return s.e.transformer.swap(modify(&cp))
}

// transformerOverrideStore implements storagetesting.InterfaceWithTransformerOverride.
type transformerOverrideStore struct {
	storage.Interface
	e *env
}

// withTransformerOverride is the store, or unsafe (the store wrapped for
// AllowUnsafeMalformedObjectDeletion) when given, whose transformer the
// suite may replace.
func (e *env) withTransformerOverride(unsafe ...storage.Interface) *transformerOverrideStore {
	s := e.store
	if len(unsafe) > 0 {
		s = unsafe[0]
	}
	return &transformerOverrideStore{Interface: s, e: e}
}

func (s *transformerOverrideStore) UpdateTransformer(modify storagetesting.TransformerModifier) func() {
	return s.e.transformer.swap(modify(s.e.transformer.get()))
}

// corruptObjectError is the error the etcd3 store gives for data it cannot
// transform, which it treats as a corrupt object (candidate for unsafe
// deletion, aggregated in lists). The type is unexported; the exported
// corrupt-object transformer wrapper makes one from a failed read.
func corruptObjectError(t testing.TB) error {
	t.Helper()
	_, _, err := etcd3.WithCorruptObjErrorHandlingTransformer(unreadableTransformer{}).
		TransformFromStorage(context.Background(), nil, value.DefaultContext(""))
	if err == nil {
		t.Fatal("the corrupt-object transformer wrapper passed a failed read")
	}
	return err
}

type unreadableTransformer struct{ value.Transformer }

func (unreadableTransformer) TransformFromStorage(context.Context, []byte, value.Context) ([]byte, bool, error) {
	return nil, true, errors.New("bits flipped")
}

// compaction is the suite's Compaction hook: compact the server like the
// apiserver's compactor, then, when the store follows compact_rev_key
// (ListFromCacheSnapshot), wait until it has seen the new revision.
func (e *env) compaction() storagetesting.Compaction {
	return func(ctx context.Context, t *testing.T, resourceVersion string) {
		rev := fixture.Compact(ctx, t, e.client.Client, resourceVersion)
		if utilfeature.DefaultFeatureGate.Enabled(features.ListFromCacheSnapshot) {
			fixture.WaitFor(ctx, t, "the store to observe the compaction", func() bool {
				return e.store.CompactRevision() == rev
			})
		}
	}
}

func (e *env) increaseRV() storagetesting.IncreaseRVFunc { return fixture.IncreaseRV(e.client.Client) }

// keysOnly lists the keys under the store's resource prefix with a keys-only
// range, the request kube-apiserver's etcd3 store (1.34 and later) sends to
// estimate a resource's object count.
func (e *env) keysOnly(prefix string) storage.KeysFunc {
	return func(ctx context.Context) ([]string, error) {
		resp, err := e.client.KV.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return nil, err
		}
		keys := make([]string, 0, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			keys = append(keys, string(kv.Key))
		}
		return keys, nil
	}
}
