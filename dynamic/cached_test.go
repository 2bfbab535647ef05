package dynamic

import (
	"fmt"
	"reflect"
	"runtime"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// TestReadyTyped: a ConfigMap readied for the cache names its kind, keeps
// only the managedFields entries asked for, shares its repeated strings
// with every other cached object, and converts to what the unstructured
// conversion makes of the same object.
func TestReadyTyped(t *testing.T) {
	decoded := func() *corev1.ConfigMap { // as protobuf decodes it: no kind, strings of its own
		cm := benchChild()
		cm.TypeMeta = metav1.TypeMeta{}
		cm.Namespace = string([]byte(cm.Namespace))
		cm.ManagedFields = append(cm.ManagedFields, metav1.ManagedFieldsEntry{Manager: "keep-me", Operation: "Apply"})
		return cm
	}
	keep := func(m string) bool { return m == "keep-me" }
	a, b := decoded(), decoded()
	want, err := typedToUnstructured(decoded(), corev1.SchemeGroupVersion, keep)
	if err != nil {
		t.Fatal(err)
	}
	if !readyTyped(a, keep) || !readyTyped(b, keep) {
		t.Fatal("a ConfigMap is not cached typed")
	}
	if a.APIVersion != "v1" || a.Kind != "ConfigMap" {
		t.Errorf("TypeMeta %+v, want v1 ConfigMap", a.TypeMeta)
	}
	if len(a.ManagedFields) != 1 || a.ManagedFields[0].Manager != "keep-me" {
		t.Errorf("managedFields %v, want keep-me's entry alone", a.ManagedFields)
	}
	if unsafe.StringData(a.Namespace) != unsafe.StringData(b.Namespace) {
		t.Error("two cached ConfigMaps hold their own copies of one namespace")
	}
	for k, v := range a.Labels {
		for k2, v2 := range b.Labels {
			if k == k2 && unsafe.StringData(k) != unsafe.StringData(k2) {
				t.Errorf("label key %q not shared", k)
			}
			if k == k2 && !isUID(v) && unsafe.StringData(v) != unsafe.StringData(v2) {
				t.Errorf("label value %q not shared", v)
			}
		}
	}
	got, ok := ToUnstructured(a)
	if !ok || !reflect.DeepEqual(got.Object, want.Object) {
		t.Fatalf("converted:\n got %v\nwant %v", got, want.Object)
	}
	// The conversion is a new object: changing it leaves the cache's alone.
	got.SetLabels(map[string]string{"changed": "yes"})
	if a.Labels["changed"] != "" {
		t.Error("changing the converted object changed the cached one")
	}
	u := &unstructured.Unstructured{}
	if same, ok := ToUnstructured(u); !ok || same != u {
		t.Error("an unstructured object is not itself")
	}
	if readyTyped(&corev1.Service{}, nil) {
		t.Error("a Service is cached typed")
	}
}

// TestCacheList: a typed list of a kind cached typed stays that list,
// holding the items kept; any other becomes an UnstructuredList.
func TestCacheList(t *testing.T) {
	list := &corev1.ConfigMapList{ListMeta: metav1.ListMeta{ResourceVersion: "42", Continue: "next"}}
	for i := range 4 {
		cm := benchChild()
		cm.TypeMeta = metav1.TypeMeta{}
		cm.Name = fmt.Sprintf("cm-%d", i)
		list.Items = append(list.Items, *cm)
	}
	even := func(obj k8sruntime.Object) bool { return obj.(*corev1.ConfigMap).Name[3]%2 == 0 }
	convert := func(obj k8sruntime.Object) (k8sruntime.Object, error) {
		if readyTyped(obj, nil) {
			return obj, nil
		}
		return typedToUnstructured(obj, corev1.SchemeGroupVersion, nil)
	}
	out, err := cacheList(list.DeepCopy(), true, even, convert)
	if err != nil {
		t.Fatal(err)
	}
	typed, ok := out.(*corev1.ConfigMapList)
	if !ok || len(typed.Items) != 2 || typed.Items[0].Name != "cm-0" || typed.Items[1].Name != "cm-2" || typed.ResourceVersion != "42" || typed.Continue != "next" {
		t.Fatalf("typed list: %T %+v", out, out)
	}
	if typed.Items[1].Kind != "ConfigMap" || typed.Items[1].ManagedFields != nil {
		t.Errorf("an item kept is not readied: %+v %v", typed.Items[1].TypeMeta, typed.Items[1].ManagedFields)
	}
	out, err = cacheList(list.DeepCopy(), false, even, func(obj k8sruntime.Object) (k8sruntime.Object, error) {
		return typedToUnstructured(obj, corev1.SchemeGroupVersion, nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	if ul, ok := out.(*unstructured.UnstructuredList); !ok || len(ul.Items) != 2 || ul.GetResourceVersion() != "42" || ul.GetContinue() != "next" {
		t.Fatalf("unstructured list: %T %+v", out, out)
	}
}

// TestTypedBookmark: the bookmark sent in place of a typed object not
// kept is of the informer's type, which its reflector insists on.
func TestTypedBookmark(t *testing.T) {
	f := newKeepFilter(WatchKey{GVR: corev1.SchemeGroupVersion.WithResource("configmaps")}, func(WatchKey, metav1.Object) bool { return false })
	f.example = typedCached[corev1.SchemeGroupVersion.WithResource("configmaps")]
	f.cache = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	cm := benchChild()
	ev, send := f.instead(watch.Event{Type: watch.Modified, Object: cm}, func(o k8sruntime.Object) (k8sruntime.Object, error) { return o, nil })
	bm, ok := ev.Object.(*corev1.ConfigMap)
	if !send || ev.Type != watch.Bookmark || !ok || bm.ResourceVersion != cm.ResourceVersion {
		t.Fatalf("sent %v %s %T, want a ConfigMap bookmark at %s", send, ev.Type, ev.Object, cm.ResourceVersion)
	}
}

// BenchmarkCachedHeap: the live heap of the same syncloop children held
// typed, as the caches hold ConfigMaps, and unstructured, as they held
// them before: bytes and heap objects each, and how long a full
// collection over them takes (the collector's marking is what the
// representation changes most).
func BenchmarkCachedHeap(b *testing.B) {
	const n = 20000
	raw := make([][]byte, n)
	for i := range raw {
		cm := benchChild()
		cm.Name = fmt.Sprintf("tenant-t-%05d", i)
		cm.UID = types.UID(fmt.Sprintf("0e4f7f4c-1a57-4d31-9b7e-%012d", i))
		data, err := cm.Marshal()
		if err != nil {
			b.Fatal(err)
		}
		raw[i] = data
	}
	for _, typed := range []bool{true, false} {
		b.Run(map[bool]string{true: "typed", false: "unstructured"}[typed], func(b *testing.B) {
			for b.Loop() {
				keep := make([]any, n)
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				for i := range raw {
					cm := &corev1.ConfigMap{}
					if err := cm.Unmarshal(raw[i]); err != nil {
						b.Fatal(err)
					}
					if typed {
						readyTyped(cm, nil)
						keep[i] = cm
						continue
					}
					u, err := typedToUnstructured(cm, corev1.SchemeGroupVersion, nil)
					if err != nil {
						b.Fatal(err)
					}
					internObject(u.Object)
					keep[i] = u
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				start := time.Now()
				runtime.GC() // marks every object held
				b.ReportMetric(float64(time.Since(start).Microseconds()), "µs/collection")
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/object")
				b.ReportMetric(float64(after.HeapObjects-before.HeapObjects)/n, "heap-objects/object")
				runtime.KeepAlive(keep)
			}
		})
	}
}
