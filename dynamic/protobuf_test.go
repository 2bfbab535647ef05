package dynamic

import (
	"bytes"
	goruntime "runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
)

// benchChild is a child as syncloop writes it, with its managedFields.
func benchChild() *corev1.ConfigMap {
	ctrl := true
	now := metav1.Now()
	return &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "tenant-t-00001", Namespace: "bench-tenants-abcde", UID: "0e4f7f4c-1a57-4d31-9b7e-4d2a3e5a6b7c",
			ResourceVersion: "123456", CreationTimestamp: now,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "syncloop", "syncloop.dev/rule": "tenant-config",
				"syncloop.dev/owner-uid": "1e4f7f4c-1a57-4d31-9b7e-4d2a3e5a6b7c"},
			Annotations: map[string]string{"syncloop.dev/owner": "bench.syncloop.dev/v1/Tenant/bench-tenants-abcde/t-00001",
				"syncloop.dev/resource-id": "config"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "bench.syncloop.dev/v1", Kind: "Tenant", Name: "t-00001",
				UID: "1e4f7f4c-1a57-4d31-9b7e-4d2a3e5a6b7c", Controller: &ctrl}},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "syncloop/tenant-config", Operation: "Apply", APIVersion: "v1", Time: &now,
				FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:data":{"f:tier":{}},"f:metadata":{"f:annotations":{"f:syncloop.dev/owner":{},"f:syncloop.dev/resource-id":{}},"f:labels":{"f:app.kubernetes.io/managed-by":{},"f:syncloop.dev/owner-uid":{},"f:syncloop.dev/rule":{}},"f:ownerReferences":{"k:{\"uid\":\"1e4f7f4c-1a57-4d31-9b7e-4d2a3e5a6b7c\"}":{}}}}`)}},
		},
		Data: map[string]string{"tier": "bronze"},
	}
}

// BenchmarkDecode compares what an informer does with one object as each
// encoding brings it: JSON decoded into unstructured maps (the dynamic
// client; managedFields then dropped by the cache's transform), and
// protobuf decoded into the typed object, managedFields dropped, then
// converted (Protobuf).
func BenchmarkDecode(b *testing.B) {
	b.Run("json", func(b *testing.B) {
		content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(benchChild())
		if err != nil {
			b.Fatal(err)
		}
		data, err := runtime.Encode(unstructured.UnstructuredJSONScheme, &unstructured.Unstructured{Object: content})
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			obj, _, err := unstructured.UnstructuredJSONScheme.Decode(data, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			delete(obj.(*unstructured.Unstructured).Object["metadata"].(map[string]any), "managedFields")
		}
	})
	b.Run("protobuf", func(b *testing.B) {
		s := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
		var buf bytes.Buffer
		if err := s.Encode(benchChild(), &buf); err != nil {
			b.Fatal(err)
		}
		data := buf.Bytes()
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			obj, _, err := s.Decode(data, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := typedToUnstructured(obj, corev1.SchemeGroupVersion, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestTypedToUnstructured: the conversion names the kind protobuf leaves
// out and keeps only the managedFields entries asked for.
func TestTypedToUnstructured(t *testing.T) {
	cm := benchChild()
	cm.TypeMeta = metav1.TypeMeta{}
	cm.ManagedFields = append(cm.ManagedFields, metav1.ManagedFieldsEntry{Manager: "keep-me", Operation: "Apply"})
	u, err := typedToUnstructured(cm, corev1.SchemeGroupVersion, func(m string) bool { return m == "keep-me" })
	if err != nil {
		t.Fatal(err)
	}
	if u.GetAPIVersion() != "v1" || u.GetKind() != "ConfigMap" {
		t.Errorf("apiVersion %q kind %q, want v1 ConfigMap", u.GetAPIVersion(), u.GetKind())
	}
	if mf := u.GetManagedFields(); len(mf) != 1 || mf[0].Manager != "keep-me" {
		t.Errorf("managedFields %v, want keep-me's entry alone", mf)
	}
	if u, err = typedToUnstructured(benchChild(), corev1.SchemeGroupVersion, nil); err != nil || u.GetManagedFields() != nil {
		t.Errorf("with nothing kept: managedFields %v, %v", u.GetManagedFields(), err)
	}
	if got, _, _ := unstructured.NestedString(u.Object, "data", "tier"); got != "bronze" {
		t.Errorf("data.tier %q, want bronze", got)
	}
}

// TestConvertingWatchStops: a watch stopped while its events go unread
// ends its goroutine and closes its channel.
func TestConvertingWatchStops(t *testing.T) {
	before := goruntime.NumGoroutine()
	fake := watch.NewRaceFreeFake()
	converted := make(chan struct{})
	w := newConvertingWatch(fake, func(ev watch.Event) (watch.Event, bool) { close(converted); return ev, true })
	fake.Add(&corev1.ConfigMap{}) // converted, then never read
	<-converted
	w.Stop()
	w.Stop() // idempotent
	// Nothing reads the result channel, as a reflector that stopped does not.
	deadline := time.Now().Add(10 * time.Second)
	for goruntime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := goruntime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after Stop, %d before: the converter is stuck on the unread event", n, before)
	}
	if _, open := <-w.ResultChan(); open {
		t.Error("the result channel is open after Stop")
	}
}
