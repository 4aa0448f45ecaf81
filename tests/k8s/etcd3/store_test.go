package etcd3

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage/etcd3"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
)

// The store tests of k8s.io/apiserver/pkg/storage/testing, wired like
// k8s.io/apiserver/pkg/storage/etcd3/store_test.go wires them. Each test runs
// on a fresh server.

// storedObjectInvariants checks what the etcd3 store writes: the value
// carries the transformer prefix and decodes to a pod without
// resourceVersion or selfLink.
func (e *env) storedObjectInvariants() storagetesting.KeyValidation {
	return func(ctx context.Context, t *testing.T, key string) {
		resp, err := e.client.KV.Get(ctx, key)
		if err != nil {
			t.Fatalf("Get(%q): %v", key, err)
		}
		if len(resp.Kvs) == 0 {
			t.Fatalf("key %q not found in the server", key)
		}
		data := resp.Kvs[0].Value
		if len(data) < len(valuePrefix) || string(data[:len(valuePrefix)]) != valuePrefix {
			t.Fatalf("stored value of %q lacks the transformer prefix %q: %q", key, valuePrefix, data)
		}
		obj, err := runtime.Decode(e.codec, data[len(valuePrefix):])
		if err != nil {
			t.Fatalf("decoding stored value of %q: %v", key, err)
		}
		pod := obj.(*example.Pod)
		if pod.ResourceVersion != "" {
			t.Errorf("stored object has resourceVersion %q, want none", pod.ResourceVersion)
		}
		if pod.SelfLink != "" {
			t.Errorf("stored object has selfLink %q, want none", pod.SelfLink)
		}
	}
}

// etcdMaxPageLimit is the cap (etcd3's unexported maxLimit) up to which the
// store doubles the page size of a filtered, paginated LIST.
const etcdMaxPageLimit = 10000

// requestCounts checks how many objects the store decoded and how many Range
// requests it sent for a paginated LIST: one request when unpaginated,
// otherwise one per page with the page size doubling from pageSize up to
// etcdMaxPageLimit until the estimated number of objects has been read.
func (e *env) requestCounts() storagetesting.CallsValidation {
	recorder := e.client.KV.(*storagetesting.KVRecorder)
	return func(t *testing.T, pageSize, estimatedProcessedObjects uint64) {
		if got := e.prefixTransformer.GetReadsAndReset(); got != estimatedProcessedObjects {
			t.Errorf("objects read: %d, want %d", got, estimatedProcessedObjects)
		}
		want := uint64(1)
		if pageSize != 0 {
			limit, read := pageSize, uint64(1)
			for read < estimatedProcessedObjects {
				limit = min(limit*2, etcdMaxPageLimit)
				read += limit
				want++
			}
		}
		// A streamed list is one GetStream however many chunks it takes.
		if got := recorder.GetReadsAndReset() + recorder.GetStreamReadsAndReset(); got != want {
			t.Fatalf("Range and RangeStream requests: %d, want %d", got, want)
		}
	}
}

func TestCreate(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestCreate(e.ctx, t, e.store, e.storedObjectInvariants())
}

func TestCreateWithTTL(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestCreateWithTTL(e.ctx, t, e.store)
}

func TestCreateWithKeyExist(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestCreateWithKeyExist(e.ctx, t, e.store)
}

func TestGet(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestGet(e.ctx, t, e.store)
}

func TestUnconditionalDelete(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestUnconditionalDelete(e.ctx, t, e.store)
}

func TestConditionalDelete(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestConditionalDelete(e.ctx, t, e.store)
}

func TestDeleteWithSuggestion(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestDeleteWithSuggestion(e.ctx, t, e.store)
}

func TestDeleteWithSuggestionAndConflict(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestDeleteWithSuggestionAndConflict(e.ctx, t, e.store)
}

func TestDeleteWithSuggestionOfDeletedObject(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestDeleteWithSuggestionOfDeletedObject(e.ctx, t, e.store)
}

func TestValidateDeletionWithSuggestion(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestValidateDeletionWithSuggestion(e.ctx, t, e.store)
}

func TestValidateDeletionWithOnlySuggestionValid(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestValidateDeletionWithOnlySuggestionValid(e.ctx, t, e.store)
}

func TestDeleteWithConflict(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestDeleteWithConflict(e.ctx, t, e.store)
}

// The delete tests for objects the store cannot read (the
// AllowUnsafeMalformedObjectDeletion path): the suite switches the store's
// transformer or codec to failing and back.

func TestDeleteWithConflictAndMissingExpectedTransformOrDecodeError(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.AllowUnsafeMalformedObjectDeletion, true)
	e := setup(t)
	storagetesting.RunTestDeleteWithConflictAndMissingExpectedTransformOrDecodeError(e.ctx, t, e.store, e.codec.setFailing)
}

func TestDeleteWithConflictAndExpectedTransformError(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.AllowUnsafeMalformedObjectDeletion, true)
	e := setup(t)
	storagetesting.RunTestDeleteExpectedTransformOrDecodeError(e.ctx, t, e.store, e.setReadsFailing)
}

func TestDeleteWithConflictAndExpectedDecodeError(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.AllowUnsafeMalformedObjectDeletion, true)
	e := setup(t)
	storagetesting.RunTestDeleteExpectedTransformOrDecodeError(e.ctx, t, e.store, e.codec.setFailing)
}

func TestDeleteWithSuggestionAndMissingExpectedTransformOrDecodeFailure(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.AllowUnsafeMalformedObjectDeletion, true)
	e := setup(t)
	storagetesting.RunTestDeleteWithSuggestionAndMissingExpectedTransformOrDecodeError(e.ctx, t, e.store)
}

func TestPreconditionalDeleteWithSuggestion(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestPreconditionalDeleteWithSuggestion(e.ctx, t, e.store)
}

func TestPreconditionalDeleteWithOnlySuggestionPass(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestPreconditionalDeleteWithOnlySuggestionPass(e.ctx, t, e.store)
}

func TestListPaging(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestListPaging(e.ctx, t, e.store)
}

func TestGetListNonRecursive(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestGetListNonRecursive(e.ctx, t, e.increaseRV(), e.store)
}

func TestGetListRecursivePrefix(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestGetListRecursivePrefix(e.ctx, t, e.store)
}

func TestKeySchema(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestKeySchema(e.ctx, t, e.store)
}

// A list over objects some of which cannot be read: with
// AllowUnsafeMalformedObjectDeletion the store (the store kube-apiserver
// builds then: wrapped for unsafe deletion) gathers the corrupt ones into one
// error; without it the first one ends the list.
func TestGetListWithErrorAggregation(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.AllowUnsafeMalformedObjectDeletion, true)
	e := setup(t)
	unsafe := etcd3.NewStoreWithUnsafeCorruptObjectDeletion(e.store, schema.GroupResource{Resource: "pods"})
	storagetesting.RunTestGetListWithErrorAggregation(e.ctx, t, e.withTransformerOverride(unsafe), corruptObjectError(t))
}

func TestGetListWithoutErrorAggregation(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.AllowUnsafeMalformedObjectDeletion, false)
	e := setup(t)
	storagetesting.RunTestGetListWithoutErrorAggregation(e.ctx, t, e.withTransformerOverride(), corruptObjectError(t))
}

func TestGuaranteedUpdate(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestGuaranteedUpdate(e.ctx, t, e.withPrefixTransformer(), e.storedObjectInvariants())
}

func TestGuaranteedUpdateWithTTL(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestGuaranteedUpdateWithTTL(e.ctx, t, e.store)
}

func TestGuaranteedUpdateChecksStoredData(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestGuaranteedUpdateChecksStoredData(e.ctx, t, e.withPrefixTransformer())
}

func TestGuaranteedUpdateWithConflict(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestGuaranteedUpdateWithConflict(e.ctx, t, e.store)
}

func TestGuaranteedUpdateWithSuggestionAndConflict(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestGuaranteedUpdateWithSuggestionAndConflict(e.ctx, t, e.store)
}

func TestTransformationFailure(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestTransformationFailure(e.ctx, t, e.withPrefixTransformer())
}

// TestList and TestConsistentList run with EtcdRangeStream on and off, as
// upstream runs them: on, every recursive list is one RangeStream, and
// checkStreamed makes sure the server really served them so.
func TestList(t *testing.T) {
	for _, rangeStream := range []bool{false, true} {
		t.Run(fmt.Sprintf("rangeStream=%v", rangeStream), func(t *testing.T) {
			featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.EtcdRangeStream, rangeStream)
			e := setup(t)
			storagetesting.RunTestList(e.ctx, t, e.store, e.compaction(), false,
				e.client.Kubernetes.(*storagetesting.KubernetesRecorder))
			e.checkStreamed(t, rangeStream)
		})
	}
}

func TestConsistentList(t *testing.T) {
	for _, rangeStream := range []bool{false, true} {
		t.Run(fmt.Sprintf("rangeStream=%v", rangeStream), func(t *testing.T) {
			featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.EtcdRangeStream, rangeStream)
			e := setup(t)
			// No watch cache; the server supports consistent reads; no cache snapshots.
			storagetesting.RunTestConsistentList(e.ctx, t, e.store, e.increaseRV(), false, true, false)
			e.checkStreamed(t, rangeStream)
		})
	}
}

func TestCompactRevision(t *testing.T) {
	// The store learns about compactions done by someone else only by
	// watching compact_rev_key, which ListFromCacheSnapshot turns on.
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ListFromCacheSnapshot, true)
	e := setup(t)
	storagetesting.RunTestCompactRevision(e.ctx, t, e.store, e.increaseRV(), e.compaction())
}

func TestListContinuation(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestListContinuation(e.ctx, t, e.store, e.requestCounts())
}

func TestListPaginationRareObject(t *testing.T) {
	// With ListFromCacheSnapshot the store also reads compact_rev_key, which
	// the request counting does not expect; upstream turns it off too.
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ListFromCacheSnapshot, false)
	e := setup(t)
	storagetesting.RunTestListPaginationRareObject(e.ctx, t, e.store, e.requestCounts())
}

func TestListContinuationWithFilter(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestListContinuationWithFilter(e.ctx, t, e.store, e.requestCounts())
}

func TestNamespaceScopedList(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestNamespaceScopedList(e.ctx, t, e.store)
}

func TestListInconsistentContinuation(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestListInconsistentContinuation(e.ctx, t, e.store, e.compaction())
}

func TestListResourceVersionMatch(t *testing.T) {
	e := setup(t)
	storagetesting.RunTestListResourceVersionMatch(e.ctx, t, e.withPrefixTransformer())
}

func TestStats(t *testing.T) {
	for _, sizeEstimate := range []bool{true, false} {
		t.Run(fmt.Sprintf("SizeBasedListCostEstimate=%v", sizeEstimate), func(t *testing.T) {
			e := setup(t)
			if sizeEstimate {
				if err := e.store.EnableResourceSizeEstimation(e.keysOnly("/pods/")); err != nil {
					t.Fatal(err)
				}
			}
			storagetesting.RunTestStats(e.ctx, t, e.store, e.codec, e.prefixTransformer, sizeEstimate)
		})
	}
}
