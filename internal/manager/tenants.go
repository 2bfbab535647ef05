package manager

import (
	"context"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/reload"
)

// tenantPath is how the rule file key of ConfigMap ns/name is named in
// errors: configmap:<ns>/<name>/<key>.
func tenantPath(ns, name, key string) string { return "configmap:" + ns + "/" + name + "/" + key }

// tenantConfigMap is the ConfigMap a tenant file path names, if it does.
func tenantConfigMap(path string) (types.NamespacedName, bool) {
	rest, ok := strings.CutPrefix(path, "configmap:")
	if !ok {
		return types.NamespacedName{}, false
	}
	parts := strings.SplitN(rest, "/", 3)
	if len(parts) != 3 {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: parts[0], Name: parts[1]}, true
}

// tenantWait bounds how long the first load waits for the tenant
// ConfigMaps to list; a list refused (RBAC) or slow loads without them,
// and they come in when they do.
const tenantWait = 30 * time.Second

// tenants are the tenant rule ConfigMaps (--tenant-rules): watched with
// syncloop's own identity, each key a rule file of its namespace that the
// rule source reads at every load (a change asks for one); and the Events that say on each
// ConfigMap why one of its files did not load.
type tenants struct {
	core      kubernetes.Interface
	namespace string // --watch-namespace: only there; "" everywhere
	src       *reload.Source
	changed   func() // a ConfigMap changed: load again
	recorder  record.EventRecorder

	informer cache.SharedIndexInformer

	mu   sync.Mutex
	last map[types.NamespacedName]string // the errors last said on each ConfigMap
}

// start watches the ConfigMaps and waits, up to tenantWait, for them to
// list, so that the first load has them.
func (t *tenants) start(ctx context.Context) {
	factory := informers.NewSharedInformerFactoryWithOptions(t.core, 0,
		informers.WithNamespace(t.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = rules.LabelTenantRules + "=true" }))
	t.informer = factory.Core().V1().ConfigMaps().Informer()
	t.src.UseTenantFiles(t.files)
	// An event only asks for a load (debounced); the load reads the files.
	changed := func(any) {
		if t.changed != nil {
			t.changed()
		}
	}
	reg, err := t.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: changed, UpdateFunc: func(_, o any) { changed(o) }, DeleteFunc: changed,
	})
	if err != nil { // the informer has not started: never
		klog.FromContext(ctx).Error(err, "Cannot watch the tenant rule ConfigMaps")
		return
	}
	go t.informer.RunWithContext(ctx)
	wctx, cancel := context.WithTimeout(ctx, tenantWait)
	defer cancel()
	if !cache.WaitFor(wctx, "", reg.HasSyncedChecker()) {
		klog.FromContext(ctx).Error(nil, "Tenant rule ConfigMaps not listed yet: loading without them; they load when they list",
			"labelSelector", rules.LabelTenantRules+"=true", "waited", tenantWait)
	}
}

// files are the tenant rule files now in the cache, for the source's loads.
func (t *tenants) files() []reload.TenantFile {
	var files []reload.TenantFile
	for _, obj := range t.informer.GetStore().List() {
		cm := obj.(*corev1.ConfigMap)
		for key, data := range cm.Data {
			files = append(files, reload.TenantFile{Path: tenantPath(cm.Namespace, cm.Name, key), Namespace: cm.Namespace, Data: []byte(data)})
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	return files
}

// announce says on each tenant ConfigMap why its files did not load — a
// Warning Event per file, with its file:line:col errors — and, once they
// load again, a Normal Event; each state once.
func (t *tenants) announce(errs []reload.FileError) {
	if t == nil || t.recorder == nil || t.informer == nil {
		return
	}
	byCM := map[types.NamespacedName][]reload.FileError{}
	for _, e := range errs {
		if cm, ok := tenantConfigMap(e.Path); ok {
			byCM[cm] = append(byCM[cm], e)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last == nil {
		t.last = map[types.NamespacedName]string{}
	}
	for cm := range t.last {
		if _, failing := byCM[cm]; !failing {
			byCM[cm] = nil // loads again
		}
	}
	for name, es := range byCM {
		var key strings.Builder
		for _, e := range es {
			key.WriteString(e.Error() + "\x00")
		}
		if key.String() == t.last[name] {
			continue
		}
		obj, ok, _ := t.informer.GetStore().GetByKey(name.String())
		if !ok { // gone: nothing to say it on
			delete(t.last, name)
			continue
		}
		cm := obj.(*corev1.ConfigMap)
		ref := &corev1.ObjectReference{APIVersion: "v1", Kind: "ConfigMap", Namespace: cm.Namespace, Name: cm.Name, UID: cm.UID, ResourceVersion: cm.ResourceVersion}
		if len(es) == 0 {
			t.recorder.Event(ref, corev1.EventTypeNormal, ReasonRulesLoaded, "every rule file of this ConfigMap loads again")
			delete(t.last, name)
			continue
		}
		for _, e := range es {
			t.recorder.Event(ref, corev1.EventTypeWarning, ReasonRuleFileNotLoaded, eventMessage(e.Error()))
		}
		t.last[name] = key.String()
	}
}

// platformErrors are the errors of errs that are not a tenant's.
func platformErrors(errs []reload.FileError) []reload.FileError {
	var out []reload.FileError
	for _, e := range errs {
		if _, tenant := tenantConfigMap(e.Path); !tenant {
			out = append(out, e)
		}
	}
	return out
}

// eventMessage is msg cut to maxEventMessage.
func eventMessage(msg string) string {
	if len(msg) > maxEventMessage {
		msg = strings.ToValidUTF8(msg[:maxEventMessage-3], "") + "..."
	}
	return msg
}
