package dynamic

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/version"
	applycorev1 "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{}) }

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

func newNamespace(t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "dyn-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("timed out waiting for %s", what)
	}
}

func TestMapper(t *testing.T) {
	env := testenv.Get(t)
	var counter testenv.RequestCounter
	dc, err := discovery.NewDiscoveryClientForConfig(counter.Wrap(env.Config()))
	if err != nil {
		t.Fatal(err)
	}
	m := NewMapper(dc, 500*time.Millisecond)

	for gvk, want := range map[schema.GroupVersionKind]bool{
		{Version: "v1", Kind: "ConfigMap"}:                                       true,
		{Version: "v1", Kind: "Namespace"}:                                       false,
		{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole"}: false,
		{Group: "apps", Version: "v1", Kind: "Deployment"}:                       true,
	} {
		got, err := m.Namespaced(gvk)
		if err != nil || got != want {
			t.Errorf("Namespaced(%v) = %v, %v; want %v", gvk, got, err, want)
		}
	}
	mapping, err := m.Mapping(t.Context(), schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"})
	if err != nil || mapping.Resource.Resource != "deployments" {
		t.Fatalf("Deployment maps to %v, %v", mapping, err)
	}

	gadget := schema.GroupVersionKind{Group: "test.syncloop.dev", Version: "v1", Kind: "Gadget"}
	if _, err := m.Mapping(t.Context(), gadget); !meta.IsNoMatchError(err) {
		t.Fatalf("unknown kind: err = %v, want a NoMatch error", err)
	}
	// Misses within the refresh interval do not re-read discovery.
	counter.Reset()
	for range 50 {
		_, _ = m.Mapping(t.Context(), gadget)
	}
	if n := len(counter.Requests(nil)); n > 10 {
		t.Errorf("50 lookups of an unknown kind made %d discovery requests; refreshes are not throttled", n)
	}

	if _, err := env.InstallCRDs(t.Context(), filepath.Join("testdata", "gadgets-crd.yaml")); err != nil {
		t.Fatal(err)
	}
	poll(t, "the Mapper to find a CRD installed after it started", func() bool {
		ns, err := m.Namespaced(gadget)
		return err == nil && ns
	})
	// Found mappings are cached: no discovery request.
	counter.Reset()
	for range 50 {
		if _, err := m.Mapping(t.Context(), gadget); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(counter.Requests(nil)); n != 0 {
		t.Errorf("50 lookups of a known kind made %d requests, want 0", n)
	}
}

// recorder is a ResourceEventHandler that remembers object names by event.
type recorder struct {
	mu      sync.Mutex
	adds    map[string]int
	updates map[string]int
	deletes map[string]int
}

func newRecorder() *recorder {
	return &recorder{adds: map[string]int{}, updates: map[string]int{}, deletes: map[string]int{}}
}

func name(obj any) string {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return "?"
	}
	return m.GetName()
}

func (r *recorder) OnAdd(obj any, _ bool) { r.mu.Lock(); r.adds[name(obj)]++; r.mu.Unlock() }
func (r *recorder) OnUpdate(_, obj any)   { r.mu.Lock(); r.updates[name(obj)]++; r.mu.Unlock() }
func (r *recorder) OnDelete(obj any)      { r.mu.Lock(); r.deletes[name(obj)]++; r.mu.Unlock() }

func (r *recorder) count(kind, n string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return map[string]map[string]int{"add": r.adds, "update": r.updates, "delete": r.deletes}[kind][n]
}

func TestRegistry(t *testing.T) {
	env := testenv.Get(t)
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, cs)
	var counter testenv.RequestCounter
	dc, err := dynamic.NewForConfig(counter.Wrap(env.Config()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	apply := func(name string, labels map[string]string) {
		t.Helper()
		cm := applycorev1.ConfigMap(name, ns).WithLabels(labels).WithData(map[string]string{"k": "v"})
		if _, err := cs.CoreV1().ConfigMaps(ns).Apply(ctx, cm, metav1.ApplyOptions{FieldManager: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	apply("before-labelled", map[string]string{"pick": "yes"})
	apply("before-plain", nil)

	goroutinesBefore := runtime.NumGoroutine()
	r := NewRegistry(dc, nil)
	labelled := WatchKey{GVR: configMaps, Namespace: ns, LabelSelector: "pick=yes"}
	everything := WatchKey{GVR: configMaps, Namespace: ns}

	rec1, rec2, rec3 := newRecorder(), newRecorder(), newRecorder()
	sub1, err := r.Subscribe(ctx, labelled, rec1)
	if err != nil {
		t.Fatal(err)
	}
	if !sub1.WaitForSync(ctx) {
		t.Fatal("first subscriber did not sync")
	}
	sub2, err := r.Subscribe(ctx, labelled, rec2)
	if err != nil {
		t.Fatal(err)
	}
	if !sub2.WaitForSync(ctx) {
		t.Fatal("second subscriber did not sync")
	}
	if n := r.Len(); n != 1 {
		t.Fatalf("two subscribers of one WatchKey run %d informers, want 1", n)
	}
	// A subscriber joining a running informer gets the cached objects.
	if rec2.count("add", "before-labelled") != 1 {
		t.Error("the second subscriber was not sent the cached object")
	}
	// The label selector is applied by the API server: the other object is
	// not in the cache at all.
	if _, exists, _ := sub1.Indexer().GetByKey(ns + "/before-plain"); exists {
		t.Error("an object outside the label selector is cached")
	}
	cached, exists, _ := sub1.Indexer().GetByKey(ns + "/before-labelled")
	if !exists {
		t.Fatal("the labelled object is not cached")
	}
	if mf, _ := meta.Accessor(cached); len(mf.GetManagedFields()) != 0 {
		t.Errorf("cached object keeps %d managedFields entries", len(mf.GetManagedFields()))
	}

	sub3, err := r.Subscribe(ctx, everything, rec3)
	if err != nil {
		t.Fatal(err)
	}
	if !sub3.WaitForSync(ctx) {
		t.Fatal("third subscriber did not sync")
	}
	if n := r.Len(); n != 2 {
		t.Fatalf("two WatchKeys run %d informers, want 2", n)
	}
	watches := func(selector string) int {
		return len(counter.Requests(func(q testenv.Request) bool {
			return q.Watch && strings.HasSuffix(q.Path, "/configmaps") && strings.Contains(q.Query, selector)
		}))
	}
	if n := watches("labelSelector=pick%3Dyes"); n != 1 {
		t.Errorf("the shared informer opened %d watches, want 1", n)
	}

	apply("after", map[string]string{"pick": "yes"})
	poll(t, "both subscribers of the shared informer to see the new object", func() bool {
		return rec1.count("add", "after") == 1 && rec2.count("add", "after") == 1 && rec3.count("add", "after") == 1
	})

	sub2.Stop()
	sub2.Stop() // idempotent
	if n := r.Len(); n != 2 {
		t.Errorf("after one of two subscribers left, %d informers run, want 2", n)
	}
	if err := cs.CoreV1().ConfigMaps(ns).Delete(ctx, "after", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "the remaining subscriber to see the delete", func() bool { return rec1.count("delete", "after") == 1 })
	if rec2.count("delete", "after") != 0 {
		t.Error("a stopped subscription still received events")
	}

	sub1.Stop()
	if n := r.Len(); n != 1 {
		t.Errorf("after the last subscriber of a key left, %d informers run, want 1", n)
	}
	sub3.Stop()
	if n := r.Len(); n != 0 {
		t.Errorf("with no subscribers, %d informers run", n)
	}
	// Stopped informers have ended their goroutines.
	poll(t, fmt.Sprintf("goroutines back to %d", goroutinesBefore), func() bool {
		return runtime.NumGoroutine() <= goroutinesBefore+2 // keep-alive HTTP connections may linger
	})
}

func TestRegistryShutdown(t *testing.T) {
	env := testenv.Get(t)
	dc, err := dynamic.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	r := NewRegistry(dc, nil)
	for i := range 3 {
		sub, err := r.Subscribe(t.Context(), WatchKey{GVR: configMaps, LabelSelector: fmt.Sprintf("n=%d", i)}, newRecorder())
		if err != nil {
			t.Fatal(err)
		}
		sub.WaitForSync(t.Context())
	}
	if r.Len() != 3 {
		t.Fatalf("%d informers, want 3", r.Len())
	}
	r.Shutdown()
	if r.Len() != 0 {
		t.Errorf("%d informers after Shutdown", r.Len())
	}
}

// TestWriter: Apply and ApplyVersion make the same server-side apply;
// ApplyVersion answers with the version the object now has, and an apply
// the server refuses comes back as the server's Status error, with its
// message, from both.
func TestWriter(t *testing.T) {
	env := testenv.Get(t)
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	var counter testenv.RequestCounter
	cl, err := NewClient(counter.Wrap(env.Config()))
	if err != nil {
		t.Fatal(err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ns := newNamespace(t, cs)
	m, err := NewMapper(disco, 0).Mapping(ctx, schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"})
	if err != nil {
		t.Fatal(err)
	}
	obj := func(name, value string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name, "namespace": ns},
			"data":     map[string]any{"k": value},
		}}
	}
	w := &Writer{Client: cl}
	rv, err := w.ApplyVersion(ctx, m, obj("a", "1"), "test", true)
	if err != nil {
		t.Fatal(err)
	}
	got, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "a", metav1.GetOptions{})
	if err != nil || got.ResourceVersion != rv || got.Data["k"] != "1" {
		t.Fatalf("after ApplyVersion: %v, version %q (answered %q), data %v", err, got.ResourceVersion, rv, got.Data)
	}
	out, err := w.Apply(ctx, m, obj("a", "2"), "test", true)
	if err != nil || out.GetResourceVersion() == rv || out.Object["data"].(map[string]any)["k"] != "2" {
		t.Fatalf("Apply: %v, %v", err, out)
	}
	if rv2, err := w.ApplyVersion(ctx, m, obj("a", "2"), "test", true); err != nil || rv2 != out.GetResourceVersion() {
		t.Errorf("a no-op ApplyVersion answered %q, %v; want the unchanged version %q", rv2, err, out.GetResourceVersion())
	}

	// Its options reach the server: another manager's change of the same
	// field conflicts unless forced, and a dry run persists nothing.
	if _, err := w.ApplyVersion(ctx, m, obj("a", "3"), "other", false); !apierrors.IsConflict(err) {
		t.Errorf("another manager's unforced apply of an owned field: %v, want a conflict", err)
	}
	dry := &Writer{Client: cl, DryRun: true}
	if rv3, err := dry.ApplyVersion(ctx, m, obj("a", "4"), "other", true); err != nil || rv3 == "" {
		t.Errorf("a forced dry-run apply: %q, %v", rv3, err)
	}
	if got, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "a", metav1.GetOptions{}); err != nil || got.Data["k"] != "2" || got.ResourceVersion != out.GetResourceVersion() {
		t.Errorf("after a dry run: %v, data %v at %q; want it untouched", err, got.Data, got.ResourceVersion)
	}
	if rv4, err := w.ApplyVersion(ctx, m, obj("a", "5"), "other", true); err != nil || rv4 == out.GetResourceVersion() {
		t.Errorf("another manager's forced apply: %q, %v", rv4, err)
	}

	bad := obj("Not_A_Name", "1")
	_, errFull := w.Apply(ctx, m, bad, "test", true)
	_, errVersion := w.ApplyVersion(ctx, m, bad, "test", true)
	for name, err := range map[string]error{"Apply": errFull, "ApplyVersion": errVersion} {
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "Not_A_Name") {
			t.Errorf("%s of an invalid name: %v, want the server's Invalid Status naming it", name, err)
		}
	}
	if errFull.Error() != errVersion.Error() {
		t.Errorf("the two report one refusal differently:\n%v\n%v", errFull, errVersion)
	}

	// Applies go without the server's second, strict decode of the body
	// (fieldValidation=Ignore), and an unknown field is refused all the
	// same: nothing a rule renders is dropped unseen.
	unknown := obj("b", "1")
	unknown.Object["dataa"] = map[string]any{"k": "1"}
	_, errFull = w.Apply(ctx, m, unknown, "test", true)
	_, errVersion = w.ApplyVersion(ctx, m, unknown, "test", true)
	for name, err := range map[string]error{"Apply": errFull, "ApplyVersion": errVersion} {
		if err == nil || !strings.Contains(err.Error(), "dataa") {
			t.Errorf("%s of an unknown field: %v, want the server's refusal naming it", name, err)
		}
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "b", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("an apply with an unknown field made the object: %v", err)
	}
	patches, answers := 0, map[string]int{}
	for _, r := range counter.Requests(nil) {
		if r.Method == http.MethodPatch {
			patches++
			answers[r.ContentType]++
			if q, _ := url.ParseQuery(r.Query); q.Get("fieldValidation") != "Ignore" {
				t.Errorf("apply %s?%s: fieldValidation %q, want Ignore", r.Path, r.Query, q.Get("fieldValidation"))
			}
		}
	}
	if patches < 8 {
		t.Errorf("the counter saw %d applies, want every one made (at least 8)", patches)
	}
	// ApplyVersion's answers, refusals included, came in protobuf (a
	// ConfigMap is a kind of client-go's); Apply's, decoded whole, in JSON.
	if answers["application/vnd.kubernetes.protobuf"] != 7 || answers["application/json"] != 3 {
		t.Errorf("the applies' answers by media type: %v; want 7 in protobuf (ApplyVersion), 3 in JSON (Apply)", answers)
	}
}

// TestWriterNamesOneSegment: a name or namespace that is not one segment
// of a request path — "..", a "/", a "%" — is refused by every write
// before any request leaves: a templated name cannot address another
// namespace, resource or subresource.
func TestWriterNamesOneSegment(t *testing.T) {
	env := testenv.Get(t)
	var counter testenv.RequestCounter
	cl, err := NewClient(counter.Wrap(env.Config()))
	if err != nil {
		t.Fatal(err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	m, err := NewMapper(disco, 0).Mapping(ctx, schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"})
	if err != nil {
		t.Fatal(err)
	}
	before := len(counter.Requests(func(r testenv.Request) bool { return r.Method != http.MethodGet }))
	w := &Writer{Client: cl}
	for _, tt := range []struct{ ns, name string }{
		{"default", "../../namespaces/kube-system/configmaps/x"},
		{"default", "victim/status"},
		{"default", ".."},
		{"default", "%2e%2e"},
		{"default/../kube-system", "x"},
		{"..", "x"},
	} {
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": tt.name, "namespace": tt.ns}}}
		if _, err := w.ApplyVersion(ctx, m, obj, "test", true); err == nil || !strings.Contains(err.Error(), "invalid") {
			t.Errorf("ApplyVersion of %s/%s: %v, want it refused", tt.ns, tt.name, err)
		}
		if _, err := w.Apply(ctx, m, obj, "test", true); err == nil {
			t.Errorf("Apply of %s/%s went through", tt.ns, tt.name)
		}
		if _, err := w.ApplyStatus(ctx, m, obj, "test", true); err == nil {
			t.Errorf("ApplyStatus of %s/%s went through", tt.ns, tt.name)
		}
		if err := w.Delete(ctx, m, tt.ns, tt.name, "uid", metav1.DeletePropagationBackground); err == nil {
			t.Errorf("Delete of %s/%s went through", tt.ns, tt.name)
		}
	}
	writes := func(r testenv.Request) bool { return r.Method != http.MethodGet } // GET /version: protobuf's check
	if sent := counter.Requests(writes)[before:]; len(sent) > 0 {
		t.Errorf("%d writes left, the first %s %s; want none", len(sent), sent[0].Method, sent[0].Path)
	}
}

// TestRegistryProtobuf: informers on client-go's kinds list and watch in
// protobuf and cache exactly the objects the dynamic client's JSON makes —
// every field, the managedFields entries kept, after updates too — while a
// custom resource stays JSON.
func TestRegistryProtobuf(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, cs)
	if _, err := env.InstallCRDs(ctx, filepath.Join("testdata", "gadgets-crd.yaml")); err != nil {
		t.Fatal(err)
	}
	plain, err := dynamic.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	objects := []string{
		`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm","labels":{"a":"b"},"annotations":{"n":"1"}},"data":{"k":"v","empty":""},"binaryData":{"bin":"AAEC"}}`,
		`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"type":"Opaque","stringData":{"password":"x"}}`,
		`{"apiVersion":"v1","kind":"Service","metadata":{"name":"svc"},"spec":{"ports":[{"name":"a","port":80,"targetPort":8080},{"name":"b","port":81,"targetPort":"http"}],"selector":{"app":"x"}}}`,
		`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"},"spec":{"replicas":2,"selector":{"matchLabels":{"app":"x"}},"template":{"metadata":{"labels":{"app":"x"}},"spec":{"containers":[{"name":"c","image":"i","resources":{"limits":{"cpu":"500m","memory":"1Gi"}},"ports":[{"containerPort":80}]}]}}}}`,
		`{"apiVersion":"test.syncloop.dev/v1","kind":"Gadget","metadata":{"name":"g"},"spec":{"size":3}}`,
	}
	gvrs := []schema.GroupVersionResource{configMaps, {Version: "v1", Resource: "secrets"}, {Version: "v1", Resource: "services"},
		{Group: "apps", Version: "v1", Resource: "deployments"}, {Group: "test.syncloop.dev", Version: "v1", Resource: "gadgets"}}
	for i := range objects {
		var u unstructured.Unstructured
		if err := u.UnmarshalJSON([]byte(objects[i])); err != nil {
			t.Fatal(err)
		}
		if _, err := plain.Resource(gvrs[i]).Namespace(ns).Apply(ctx, u.GetName(), &u, metav1.ApplyOptions{FieldManager: "test", Force: true}); err != nil {
			t.Fatal(err)
		}
		// A second manager, whose entry the caches keep.
		if _, err := plain.Resource(gvrs[i]).Namespace(ns).Patch(ctx, gvrName(t, objects[i]), types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"kept":"yes"}}}`), metav1.PatchOptions{FieldManager: "keep-me"}); err != nil {
			t.Fatal(err)
		}
	}

	var counter testenv.RequestCounter
	c, err := NewClient(counter.Wrap(env.Config()))
	if err != nil {
		t.Fatal(err)
	}
	keep := func(m string) bool { return m == "keep-me" }
	viaJSON, viaProtobuf := NewRegistry(plain, nil), NewRegistry(c.Dynamic, nil)
	viaJSON.KeepManagedFields, viaProtobuf.KeepManagedFields = keep, keep
	viaProtobuf.Protobuf = c.Protobuf()
	defer viaJSON.Shutdown()
	defer viaProtobuf.Shutdown()
	subscribe := func(r *Registry, gvr schema.GroupVersionResource) *Subscription {
		t.Helper()
		sub, err := r.Subscribe(ctx, WatchKey{GVR: gvr, Namespace: ns}, cache.ResourceEventHandlerFuncs{})
		if err != nil {
			t.Fatal(err)
		}
		syncCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if !sub.WaitForSync(syncCtx) {
			t.Fatalf("%s did not sync", gvr)
		}
		return sub
	}
	type pair struct{ json, protobuf *Subscription }
	subs := make([]pair, len(gvrs))
	for i, gvr := range gvrs {
		subs[i] = pair{subscribe(viaJSON, gvr), subscribe(viaProtobuf, gvr)}
	}
	same := func(i int, rv string) bool {
		t.Helper()
		key := ns + "/" + gvrName(t, objects[i])
		a, okA, _ := subs[i].json.Indexer().GetByKey(key)
		b, okB, _ := subs[i].protobuf.Indexer().GetByKey(key)
		if !okA || !okB {
			return false
		}
		// ConfigMaps and Secrets are cached typed (cached.go), the rest
		// unstructured; converted, they are what the JSON informer caches.
		if _, isU := b.(*unstructured.Unstructured); isU == (typedCached[gvrs[i]] != nil) {
			t.Fatalf("%s: the protobuf informer caches a %T", gvrs[i], b)
		}
		ua := a.(*unstructured.Unstructured)
		ub, ok := ToUnstructured(b)
		if !ok {
			t.Fatalf("%s: %T not convertible", gvrs[i], b)
		}
		if rv != "" && (ua.GetResourceVersion() != rv || ub.GetResourceVersion() != rv) {
			return false // not there yet
		}
		if !reflect.DeepEqual(ua.Object, ub.Object) {
			t.Fatalf("%s: the protobuf informer caches\n%v\nthe JSON one\n%v", gvrs[i], ub.Object, ua.Object)
		}
		if mf := ub.GetManagedFields(); len(mf) != 1 || mf[0].Manager != "keep-me" {
			t.Fatalf("%s: managedFields %v, want keep-me's entry alone", gvrs[i], mf)
		}
		return true
	}
	for i := range gvrs {
		if !same(i, "") {
			t.Fatalf("%s: not cached", gvrs[i])
		}
	}
	// Updates reach both alike, through the watch.
	for i := range objects {
		live, err := plain.Resource(gvrs[i]).Namespace(ns).Patch(ctx, gvrName(t, objects[i]), types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"changed":"yes"}}}`), metav1.PatchOptions{FieldManager: "test"})
		if err != nil {
			t.Fatal(err)
		}
		poll(t, gvrs[i].String()+" updated in both caches", func() bool { return same(i, live.GetResourceVersion()) })
	}
	for _, q := range counter.Requests(func(q testenv.Request) bool {
		return q.Method == "GET" && strings.Contains(q.Path, "/namespaces/"+ns+"/")
	}) {
		want := "application/vnd.kubernetes.protobuf"
		if strings.HasSuffix(q.Path, "/gadgets") {
			want = "application/json" // no protobuf for custom resources
		}
		if q.Watch && q.ContentType == "application/json;stream=watch" {
			q.ContentType = "application/json"
		}
		if !strings.HasPrefix(q.ContentType, want) {
			t.Errorf("%s %s?%s answered %q, want %s", q.Method, q.Path, q.Query, q.ContentType, want)
		}
	}
}

func gvrName(t *testing.T, object string) string {
	t.Helper()
	var u unstructured.Unstructured
	if err := u.UnmarshalJSON([]byte(object)); err != nil {
		t.Fatal(err)
	}
	return u.GetName()
}

func TestTypesKnowServer(t *testing.T) {
	for _, c := range []struct {
		major, minor string
		types        int
		want         bool
	}{
		{"1", "37", 37, true},
		{"1", "36", 37, true},
		{"1", "37+", 37, true},
		{"1", "38", 37, false}, // a newer server may send fields the types lack
		{"1", "38+", 37, false},
		{"1", "37", 0, false}, // the types' version unknown
		{"2", "0", 37, false},
		{"1", "x", 37, false},
	} {
		if got := typesKnowServer(&version.Info{Major: c.major, Minor: c.minor}, c.types); got != c.want {
			t.Errorf("server %s.%s, types 1.%d: %v, want %v", c.major, c.minor, c.types, got, c.want)
		}
	}
	// typesMinor is the k8s.io/api module's version.
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("\tk8s.io/api v0.%d.", typesMinor); !strings.Contains(string(mod), want) {
		t.Errorf("go.mod does not require %q: set typesMinor to the k8s.io/api module's minor version", strings.TrimSpace(want))
	}
}
