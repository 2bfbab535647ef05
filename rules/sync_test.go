package rules

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestRuleFunctionDecoding: spec.function is a resource of the rule, id
// sync, after spec.resources, whose function speaks the sync hook
// protocol; a webhook is a URL or a Service; every mistake is an error at
// its line.
func TestRuleFunctionDecoding(t *testing.T) {
	dir := t.TempDir()
	const kinds = "    kinds: [{apiVersion: v1, kind: ConfigMap}]\n"
	for _, tc := range []struct {
		name, yaml, want string
		url              string // the webhook's, when valid
	}{
		{name: "url", yaml: "  function:\n" + kinds + "    webhook: {url: 'http://hooks.example/sync'}\n", url: "http://hooks.example/sync"},
		{name: "service", yaml: "  function:\n" + kinds + "    webhook: {service: {name: hello, namespace: demo, port: 8080}, path: /sync}\n    timeout: 30s\n",
			url: "http://hello.demo:8080/sync"},
		{name: "beside resources", yaml: "  resources:\n    - id: cm\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: ns}}\n  function:\n" + kinds + "    webhook: {url: 'https://hooks.example/sync'}\n",
			url: "https://hooks.example/sync"},
		{name: "no kinds", yaml: "  function:\n    webhook: {url: 'http://h/sync'}\n",
			want: `r.yaml:10:5: rule "r": spec.function.kinds: required: list every kind the function may return`},
		{name: "neither", yaml: "  function:\n" + kinds + "    timeout: 1s\n",
			want: `r.yaml:10:5: rule "r": spec.function.wasm: required (or webhook)`},
		{name: "both", yaml: "  function:\n" + kinds + "    wasm: fn.wasm\n    webhook: {url: 'http://h/sync'}\n",
			want: `r.yaml:12:14: rule "r": spec.function.webhook: a function is a module (wasm) or a webhook, not both`},
		{name: "url and service", yaml: "  function:\n" + kinds + "    webhook: {url: 'http://h/s', service: {name: a, namespace: b}}\n",
			want: `spec.function.webhook.service: a webhook has a url or a service, not both`},
		{name: "bad scheme", yaml: "  function:\n" + kinds + "    webhook: {url: 'ftp://h/sync'}\n",
			want: `r.yaml:11:20: rule "r": spec.function.webhook.url: "ftp://h/sync": the scheme must be http or https`},
		{name: "service without namespace", yaml: "  function:\n" + kinds + "    webhook: {service: {name: a}}\n",
			want: `spec.function.webhook.service.namespace: required`},
		{name: "bad port", yaml: "  function:\n" + kinds + "    webhook: {service: {name: a, namespace: b, port: 70000}}\n",
			want: `spec.function.webhook.service.port: must be a port, 1 to 65535`},
		{name: "CA on http", yaml: "  function:\n" + kinds + "    webhook: {url: 'http://h/s', caBundle: eA==}\n",
			want: `spec.function.webhook.caBundle: "http://h/s": a CA bundle is for an https URL`},
		{name: "serve on a webhook", yaml: "  function:\n" + kinds + "    webhook: {url: 'http://h/s'}\n    serve: true\n",
			want: `spec.function.serve: is for a module: leave it out of a webhook`},
		{name: "id taken", yaml: "  resources:\n    - id: sync\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: ns}}\n  function:\n" + kinds + "    webhook: {url: 'http://h/s'}\n",
			want: `spec.function: a resource has the id "sync", which the rule's function takes: rename it`},
		{name: "finalize", yaml: "  function:\n" + kinds + "    webhook: {url: 'http://h/sync'}\n    finalize:\n      webhook: {url: 'http://h/finalize'}\n      timeout: 3s\n",
			url: "http://h/sync"},
		{name: "finalize without a hook", yaml: "  function:\n" + kinds + "    webhook: {url: 'http://h/sync'}\n    finalize: {timeout: 3s}\n",
			want: `spec.function.finalize.wasm: required (or webhook)`},
		{name: "finalize with kinds", yaml: "  function:\n" + kinds + "    webhook: {url: 'http://h/sync'}\n    finalize: {webhook: {url: 'http://h/f'}, kinds: []}\n",
			want: `spec.function.finalize: unknown field "kinds"`},
		{name: "customize", yaml: "  lookups: [{id: defaults, apiVersion: v1, kind: ConfigMap, namespace: n, name: d}]\n  function:\n" + kinds + "    webhook: {url: 'http://h/sync'}\n    customize:\n      kinds: [{apiVersion: v1, kind: Secret}, {apiVersion: apps/v1, kind: Deployment}]\n      webhook: {url: 'http://h/customize'}\n",
			url: "http://h/sync"},
		{name: "customize without kinds", yaml: "  function:\n" + kinds + "    webhook: {url: 'http://h/sync'}\n    customize: {webhook: {url: 'http://h/c'}}\n",
			want: `r.yaml:12:16: rule "r": spec.function.customize.kinds: required: list every kind the customize function may name`},
		{name: "customize kind twice", yaml: "  function:\n" + kinds + "    webhook: {url: 'http://h/sync'}\n    customize: {webhook: {url: 'http://h/c'}, kinds: [{apiVersion: v1, kind: Secret}, {apiVersion: v1, kind: Secret}]}\n",
			want: `spec.function.customize.kinds[1]: v1 Secret is listed twice`},
		{name: "reads", yaml: "  function:\n" + kinds + "    webhook: {url: 'http://h/s'}\n    reads: [x]\n",
			want: `spec.function: unknown field "reads"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := newLoader(t).Parse(filepath.Join(dir, "r.yaml"), []byte(head+watchNS+tc.yaml))
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				r := f.Rules[0]
				sync := r.Sync()
				if sync == nil || sync.ID != SyncResourceID || sync != r.Resources[len(r.Resources)-1] || sync.Index != len(r.Resources)-1 {
					t.Fatalf("resources %v: want the rule's function last, id sync", r.Resources)
				}
				if fn := sync.Function; !fn.Sync || fn.Webhook == nil || fn.Webhook.URL != tc.url || fn.Transport() != "webhook" {
					t.Fatalf("function %+v: want a sync webhook at %s", fn, tc.url)
				}
				if !r.WritesStatus() || !r.WritesStatusField("anything") {
					t.Error("a rule with a function writes the whole status")
				}
				if tc.name == "service" && sync.Function.Limits.Timeout.String() != "30s" {
					t.Errorf("timeout %s, want 30s", sync.Function.Limits.Timeout)
				}
				if fin := sync.Function.Finalize; (tc.name == "finalize") != (fin != nil) || r.Finalizes() != (fin != nil) || r.HoldsTriggers() != (fin != nil) {
					t.Errorf("finalize %+v, Finalizes %v", fin, r.Finalizes())
				} else if fin != nil && (fin.Webhook.URL != "http://h/finalize" || !fin.Sync || fin.Limits.Timeout.String() != "3s") {
					t.Errorf("finalize %+v: want a sync webhook at http://h/finalize, 3s", fin)
				}
				if cust := sync.Function.Customize; (tc.name == "customize") != (cust != nil) {
					t.Errorf("customize %+v", cust)
				} else if cust != nil {
					checkRelated(t, r, cust)
				}
				if tc.name == "url" && sync.Function.Limits.Timeout != DefaultWebhookTimeout {
					t.Errorf("timeout %s, want the default %s", sync.Function.Limits.Timeout, DefaultWebhookTimeout)
				}
				return
			}
			got := ""
			if err != nil {
				got = strings.ReplaceAll(err.Error(), dir+"/", "")
			}
			if !strings.Contains(got, tc.want) {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

// checkRelated checks that a customize function's kinds are lookups of
// the rule after spec.lookups, read only as it says: not in LookupOrder.
func checkRelated(t *testing.T, r *Rule, cust *Function) {
	t.Helper()
	if cust.Hook != "customize" || cust.Webhook.URL != "http://h/customize" || cust.Memo == nil || cust.CallID(r.Sync()) != "sync/customize" {
		t.Errorf("customize %+v: want the customize hook at http://h/customize, with a memo", cust)
	}
	if len(r.Lookups) != 3 || len(r.LookupOrder) != 1 || r.LookupOrder[0].ID != "defaults" {
		t.Fatalf("lookups %v, order %v: want defaults, then the two related kinds out of the order", r.Lookups, r.LookupOrder)
	}
	for i, l := range r.Lookups[1:] {
		if !l.Related || l.Index != i+1 || l != cust.Related[i] || !strings.HasPrefix(l.ID, RelatedLookupPrefix) || !l.List() {
			t.Errorf("lookup %d %+v: want related kind %d, a list", i+1, l, i)
		}
	}
	if r.Lookups[2].GVK.Kind != "Deployment" || r.Lookups[2].GVK.Group != "apps" {
		t.Errorf("related %v: want apps/v1 Deployment", r.Lookups[2].GVK)
	}
}
