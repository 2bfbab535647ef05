// Command demo shows syncloop at work on a local control plane: it starts
// etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok
// (internal/testenv's Workloads: Deployments' Pods become Ready), installs
// the examples' CRDs and sample objects, runs `syncloop run -f` on a copy
// of the examples as a separate process, prints the children syncloop
// creates, waits for the Apps to be Ready, shows `syncloop trace` of one
// and the graph of its rule, changes the rule and follows its rollout step
// by step, changes and deletes a trigger to show syncloop following, and
// stops everything. `make demo` runs it; hack/testenv.sh must have built the
// control plane.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/syncloop/syncloop/internal/examplefn"
	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
)

func main() {
	syncloopBin := flag.String("syncloop", "bin/syncloop", "the syncloop binary to run")
	examples := flag.String("examples", "examples", "the examples directory")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := demo(ctx, *syncloopBin, *examples); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

type cluster struct {
	cs     kubernetes.Interface
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func demo(ctx context.Context, bin, examples string) error {
	step("Starting a local control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and kwok as the kubelet of a fake Node)")
	start := time.Now()
	env, err := testenv.Start(ctx, testenv.Options{Workloads: true})
	if err != nil {
		return err
	}
	defer func() {
		env.Stop()
		step("Control plane stopped; its scratch directory is removed.")
	}()
	fmt.Printf("   ready in %v; kubeconfig %s\n", time.Since(start).Round(100*time.Millisecond), env.Kubeconfig())

	cfg := env.Config()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	c := &cluster{cs: cs, dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))}
	// syncloop runs from a copy, whose app rule the demo changes.
	original := examples
	if err := examplefn.Build(original); err != nil { // the catalogue's function, for WebAssembly
		return err
	}
	examples = filepath.Join(env.Dir(), "examples")
	if err := copyExamples(original, examples); err != nil {
		return err
	}

	step("Creating the examples' sample objects")
	objects, _ := filepath.Glob(filepath.Join(examples, "*", "objects.yaml"))
	var later []*unstructured.Unstructured // of kinds a rule defines: served once syncloop runs
	for _, f := range objects {
		notServed, err := c.applyFile(ctx, f)
		if err != nil {
			return err
		}
		later = append(later, notServed...)
	}

	step("Running: " + bin + " run -f " + examples + "/")
	probe, err := testenv.FreeAddress()
	if err != nil {
		return err
	}
	metricsAddr, err := testenv.FreeAddress()
	if err != nil {
		return err
	}
	logPath := filepath.Join(env.Dir(), "syncloop.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(bin, "run", "-f", examples, "--kubeconfig", env.Kubeconfig(),
		"--health-probe-bind-address", probe, "--metrics-bind-address", metricsAddr)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	runStart := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopSyncloop := func() error {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			return err
		case <-time.After(40 * time.Second):
			_ = cmd.Process.Kill()
			return errors.New("syncloop did not stop within 40s")
		}
	}
	defer func() {
		if cmd.ProcessState == nil {
			_ = stopSyncloop()
		}
	}()

	if len(later) > 0 {
		step("Creating the objects of the kinds the rules define, once syncloop has created their CRDs")
		if err := c.waitFor(ctx, "the CRDs", func(ctx context.Context) (bool, error) {
			c.mapper.Reset()
			for _, u := range later {
				if _, err := c.mapper.RESTMapping(u.GroupVersionKind().GroupKind(), u.GroupVersionKind().Version); err != nil {
					return false, nil
				}
			}
			return true, nil
		}); err != nil {
			tail(logPath)
			return err
		}
		for _, u := range later {
			if err := c.apply(ctx, u, "demo"); err != nil {
				return err
			}
		}
	}

	wantChildren, err := expectedChildren(bin, examples)
	if err != nil {
		return err
	}
	var children []child
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-exited:
			return false, fmt.Errorf("syncloop exited: %v; see %s", err, logPath)
		default:
		}
		children, err = c.children(ctx)
		return len(children) >= wantChildren, err
	})
	if err != nil {
		tail(logPath)
		return fmt.Errorf("waiting for syncloop's children: %w", err)
	}
	fmt.Printf("   %d children reconciled in %v:\n\n", len(children), time.Since(runStart).Round(100*time.Millisecond))
	printChildren(children)
	if err := c.printAppStatus(ctx); err != nil {
		return err
	}
	if err := c.printChain(ctx); err != nil {
		return err
	}
	if err := showTrace(ctx, bin, env.Kubeconfig()); err != nil {
		return err
	}
	if err := showGraph(ctx, bin, examples); err != nil {
		return err
	}

	if err := showMetrics(ctx, probe, metricsAddr); err != nil {
		return err
	}
	if err := rollOut(ctx, bin, env.Kubeconfig(), examples, logPath); err != nil {
		tail(logPath)
		return err
	}

	step("Changing a trigger: namespace sandbox moves from tier free to gold")
	if err := c.labelNamespace(ctx, "sandbox", "tier", "gold"); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "the new quota", func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().ResourceQuotas("sandbox").Get(ctx, "tenant-quota", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return err
	}
	q, _ := cs.CoreV1().ResourceQuotas("sandbox").Get(ctx, "tenant-quota", metav1.GetOptions{})
	fmt.Printf("   ResourceQuota sandbox/tenant-quota created: pods=%s, requests.cpu=%s\n",
		q.Spec.Hard.Pods().String(), q.Spec.Hard.Name("requests.cpu", "").String())
	settings, err := cs.CoreV1().ConfigMaps("sandbox").Get(ctx, "tenant-settings", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if settings.Data["tier"] != "free" {
		return fmt.Errorf("ConfigMap sandbox/tenant-settings, made once, was updated: tier=%s", settings.Data["tier"])
	}
	fmt.Printf("   ConfigMap sandbox/tenant-settings (createOnce) left as it was made: tier=%s\n", settings.Data["tier"])

	step("Deleting a trigger: the Secret platform/registry-pull")
	if err := cs.CoreV1().Secrets("platform").Delete(ctx, "registry-pull", metav1.DeleteOptions{}); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "its copies to be pruned", func(ctx context.Context) (bool, error) {
		_, errShop := cs.CoreV1().Secrets("shop").Get(ctx, "registry-pull", metav1.GetOptions{})
		_, errSandbox := cs.CoreV1().Secrets("sandbox").Get(ctx, "registry-pull", metav1.GetOptions{})
		return apierrors.IsNotFound(errShop) && apierrors.IsNotFound(errSandbox), nil
	}); err != nil {
		return err
	}
	fmt.Println("   its copies in shop and sandbox were pruned (they live in other namespaces: no ownerReference could do it)")

	step("Stopping syncloop (SIGTERM)")
	if err := stopSyncloop(); err != nil {
		tail(logPath)
		return fmt.Errorf("syncloop: %w", err)
	}
	fmt.Println("   exited cleanly. Its log:", logPath, "(removed with the control plane)")
	tail(logPath)
	// A demo of ordinary work logs no error: contention between the
	// examples' triggers (two patch one Namespace) is not one.
	if errs := errorLines(logPath); len(errs) > 0 {
		fmt.Println("   syncloop logged errors:")
		for _, l := range errs {
			fmt.Println("   | " + l)
		}
		return fmt.Errorf("syncloop logged %d errors", len(errs))
	}
	return nil
}

// errorLines are the lines of syncloop's log at klog's error severity.
func errorLines(path string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if len(l) > 1 && l[0] == 'E' && l[1] >= '0' && l[1] <= '9' {
			out = append(out, l)
		}
	}
	return out
}

// expectedChildren asks `syncloop render` how many children the examples
// make from their sample objects.
func expectedChildren(bin, examples string) (int, error) {
	dirs, _ := filepath.Glob(filepath.Join(examples, "*", "rules.yaml"))
	total := 0
	for _, rules := range dirs {
		dir := filepath.Dir(rules)
		args := []string{"render", "-o", "json", "-f", rules}
		if _, err := os.Stat(filepath.Join(dir, "objects.yaml")); err == nil {
			args = append(args, "--objects", filepath.Join(dir, "objects.yaml"))
		}
		out, err := exec.Command(bin, args...).Output()
		if err != nil {
			return 0, fmt.Errorf("%s %s: %w", bin, strings.Join(args, " "), err)
		}
		var doc struct {
			Results []struct {
				Children []any `json:"children"`
			} `json:"results"`
		}
		if err := json.Unmarshal(out, &doc); err != nil {
			return 0, err
		}
		for _, r := range doc.Results {
			total += len(r.Children)
		}
	}
	return total, nil
}

func step(s string) { fmt.Printf("\n== %s\n", s) }

// applyFile server-side applies every object of a YAML file, creating the
// namespaces they live in first. Sample uids are dropped: the API server
// assigns its own.
// It returns the objects of kinds not served yet (a rule defines them, and
// syncloop creates their CRDs): not applied.
func (c *cluster) applyFile(ctx context.Context, path string) (notServed []*unstructured.Unstructured, err error) {
	objs, err := rules.ReadObjects(path)
	if err != nil {
		return nil, err
	}
	// One field manager per file: two examples' labels on one namespace merge.
	manager := "demo-" + filepath.Base(filepath.Dir(path))
	for _, u := range objs {
		if _, err := c.mapper.RESTMapping(u.GroupVersionKind().GroupKind(), u.GroupVersionKind().Version); meta.IsNoMatchError(err) {
			notServed = append(notServed, u)
			continue
		}
		if err := c.apply(ctx, u, manager); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return notServed, nil
}

// apply server-side applies one object as manager, creating its namespace.
func (c *cluster) apply(ctx context.Context, u *unstructured.Unstructured, manager string) error {
	u.SetUID("")
	if ns := u.GetNamespace(); ns != "" {
		_, err := c.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	m, err := c.mapper.RESTMapping(u.GroupVersionKind().GroupKind(), u.GroupVersionKind().Version)
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = c.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = c.dyn.Resource(m.Resource).Namespace(u.GetNamespace())
	}
	if _, err := ri.Apply(ctx, u.GetName(), u, metav1.ApplyOptions{FieldManager: manager, Force: true}); err != nil {
		return fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
	}
	fmt.Printf("   %-10s %s/%s\n", u.GetKind(), u.GetNamespace(), u.GetName())
	return nil
}

type child struct{ rule, kind, name, trigger string }

var childKinds = []schema.GroupVersionResource{
	{Version: "v1", Resource: "configmaps"}, {Version: "v1", Resource: "secrets"},
	{Version: "v1", Resource: "resourcequotas"}, {Version: "v1", Resource: "services"}, {Version: "v1", Resource: "serviceaccounts"},
	{Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"},
	{Group: "apps", Version: "v1", Resource: "deployments"},
	{Group: "policy", Version: "v1", Resource: "poddisruptionbudgets"},
}

// children lists every object syncloop manages.
func (c *cluster) children(ctx context.Context) ([]child, error) {
	var out []child
	for _, gvr := range childKinds {
		list, err := c.dyn.Resource(gvr).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=syncloop"})
		if err != nil {
			return nil, err
		}
		for _, o := range list.Items {
			out = append(out, child{rule: o.GetLabels()["syncloop.dev/rule"], kind: o.GetKind(),
				name: o.GetNamespace() + "/" + o.GetName(), trigger: o.GetAnnotations()["syncloop.dev/owner"]})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.rule != b.rule {
			return a.rule < b.rule
		}
		return a.kind+a.name < b.kind+b.name
	})
	return out, nil
}

func printChildren(children []child) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "   RULE\tKIND\tNAMESPACE/NAME\tTRIGGER")
	for _, c := range children {
		fmt.Fprintf(w, "   %s\t%s\t%s\t%s\n", c.rule, c.kind, c.name, c.trigger)
	}
	w.Flush()
}

func (c *cluster) printAppStatus(ctx context.Context) error {
	gvr := schema.GroupVersionResource{Group: "example.syncloop.dev", Version: "v1", Resource: "apps"}
	return c.waitFor(ctx, "the Apps Ready", func(ctx context.Context) (bool, error) {
		list, err := c.dyn.Resource(gvr).Namespace("shop").List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) == 0 {
			return false, nil
		}
		for _, a := range list.Items {
			if st, _ := a.Object["status"].(map[string]any); st == nil || st["address"] == "" || readyCondition(&a)["status"] != "True" {
				return false, nil
			}
		}
		fmt.Println()
		for _, a := range list.Items {
			st := a.Object["status"].(map[string]any)
			rc := readyCondition(&a)
			fmt.Printf("   App %s/%s status: ready=%v readyReplicas=%v address=%v (the Service's clusterIP)\n", a.GetNamespace(), a.GetName(), st["ready"], st["readyReplicas"], st["address"])
			fmt.Printf("     condition Ready=%v reason=%v: %v\n", rc["status"], rc["reason"], rc["message"])
		}
		fmt.Println("   (kwok's fake Node runs the Deployments' Pods: they become Ready, and so do the Apps)")
		return true, nil
	})
}

// readyCondition is an object's status.conditions[type=Ready], or nil.
func readyCondition(obj *unstructured.Unstructured) map[string]any {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Ready" {
			return m
		}
	}
	return nil
}

// printChain shows the ci-robot example's chain: the kubeconfig Secret was
// made only once the token controller had filled in the token it holds.
func (c *cluster) printChain(ctx context.Context) error {
	return c.waitFor(ctx, "the CI robot's kubeconfig", func(ctx context.Context) (bool, error) {
		token, err := c.cs.CoreV1().Secrets("builds").Get(ctx, "ci-robot-token", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		kc, err := c.cs.CoreV1().Secrets("builds").Get(ctx, "ci-robot-kubeconfig", metav1.GetOptions{})
		if err != nil || len(token.Data["token"]) == 0 {
			return false, nil
		}
		fmt.Printf("\n   builds/ci-robot-kubeconfig: %d bytes, holding the %d-byte token Kubernetes' token controller wrote into builds/ci-robot-token\n",
			len(kc.Data["config"]), len(token.Data["token"]))
		fmt.Println("   (syncloop applied it only once the token's readyWhen held)")
		return true, nil
	})
}

func (c *cluster) labelNamespace(ctx context.Context, name, key, value string) error {
	ns, err := c.cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	ns.Labels[key] = value
	_, err = c.cs.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{})
	return err
}

func (c *cluster) waitFor(ctx context.Context, what string, cond wait.ConditionWithContextFunc) error {
	start := time.Now()
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, cond); err != nil {
		return fmt.Errorf("waiting for %s: %w", what, err)
	}
	fmt.Printf("   (%s after %v)\n", what, time.Since(start).Round(10*time.Millisecond))
	return nil
}

// showMetrics checks /readyz and prints some of /metrics; it fails when a
// metric syncloop promises is missing.
func showMetrics(ctx context.Context, probeAddr, metricsAddr string) error {
	get := func(url string) (int, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0, "", err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	// Ready once every rule runs: poll with a deadline, as a readiness
	// probe would, rather than read it once.
	var code int
	var body string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		var err error
		code, body, err = get("http://" + probeAddr + "/readyz")
		return err == nil && code == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("/readyz not 200 within 30s: answered %d:\n%s", code, body)
	}
	step("GET /readyz: 200")
	for _, l := range strings.Split(strings.TrimSpace(body), "\n") {
		fmt.Println("   " + l)
	}
	_, body, err = get("http://" + metricsAddr + "/metrics")
	if err != nil {
		return err
	}
	step("GET /metrics (some of it)")
	for _, name := range []string{"syncloop_reconcile_total", "syncloop_reconcile_duration_seconds", "syncloop_apply_total",
		"syncloop_rules_loaded", "syncloop_rules_reload_total", "syncloop_informers", "workqueue_depth", "rest_client_requests_total"} {
		if !strings.Contains(body, "\n"+name) {
			return fmt.Errorf("/metrics lacks %s", name)
		}
	}
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "syncloop_apply_total{") && strings.Contains(l, "tenant-defaults") ||
			strings.HasPrefix(l, "syncloop_informers ") || strings.HasPrefix(l, "syncloop_rules_loaded ") {
			fmt.Println("   " + l)
		}
	}
	return nil
}

// tail prints the last lines of syncloop's log.
func tail(path string) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > 8 {
		lines = lines[len(lines)-8:]
	}
	fmt.Println("   last lines of syncloop's log:")
	for _, l := range lines {
		fmt.Println("   | " + l)
	}
}
