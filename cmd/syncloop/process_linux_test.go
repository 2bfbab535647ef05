package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
)

// fanoutRules: every ConfigMap labelled fanout in NS gets three copies.
const fanoutRules = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: fanout}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: fanout}
  resources:
    - id: copy
      forEach: "['a', 'b', 'c']"
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-${item}"}
        data: {v: "${object.data.v}"}
`

// syncloopProcess starts `syncloop run` as a process of its own (this test
// binary, see runAsSyncloop), its output going to a file in the test's
// directory. It dies with the test.
func syncloopProcess(t *testing.T, name string, args ...string) *exec.Cmd {
	t.Helper()
	log, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		log.Close()
		if t.Failed() {
			out, _ := os.ReadFile(log.Name())
			t.Logf("%s output:\n%s", name, tail(string(out), 40))
		}
	})
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), runAsSyncloop+"=1")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestCrashAndRestart: syncloop is SIGKILLed half-way through reconciling 60
// triggers; while it is down, 10 triggers are deleted and 10 changed. The
// restarted process converges: every trigger has exactly its three
// children, owned by its UID and holding its data, and no child of a
// deleted trigger is left.
func TestCrashAndRestart(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, cs, "crash")
	cms := cs.CoreV1().ConfigMaps(ns)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(strings.ReplaceAll(fanoutRules, "NS", ns)), 0o644); err != nil {
		t.Fatal(err)
	}
	const triggers = 60
	for i := range triggers {
		if _, err := cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("t-%02d", i), Labels: map[string]string{"fanout": "yes"}},
			Data:       map[string]string{"v": "1"},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	children := func() []corev1.ConfigMap {
		list, err := cms.List(ctx, metav1.ListOptions{LabelSelector: rules.LabelRule + "=fanout"})
		if err != nil {
			t.Fatal(err)
		}
		return list.Items
	}
	poll := func(what string, cond func() bool) { t.Helper(); pollUntil(t, 60*time.Second, what, cond) }
	common := []string{"run", "-f", dir, "--kubeconfig", env.Kubeconfig(), "--metrics-bind-address=0", "--health-probe-bind-address=0"}

	// 180 applies at 15 requests a second take 12 s: kill it early on.
	first := syncloopProcess(t, "first", append(common, "--qps=15", "--burst=1")...)
	poll("the first children", func() bool { return len(children()) >= 20 })
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	n := len(children())
	if n >= 3*triggers {
		t.Fatalf("%d children when killed: not mid-reconcile", n)
	}
	t.Logf("killed with %d of %d children made", n, 3*triggers)

	for i := range 10 {
		if err := cms.Delete(ctx, fmt.Sprintf("t-%02d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cms.Patch(ctx, fmt.Sprintf("t-%02d", 50+i), types.MergePatchType, []byte(`{"data":{"v":"2"}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	second := syncloopProcess(t, "second", common...)
	converged := func() (bool, string) {
		live, err := cms.List(ctx, metav1.ListOptions{LabelSelector: "fanout"})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]corev1.ConfigMap{}
		for _, trig := range live.Items {
			for _, item := range []string{"a", "b", "c"} {
				want[trig.Name+"-"+item] = trig
			}
		}
		got := children()
		for _, c := range got {
			trig, ok := want[c.Name]
			switch {
			case !ok:
				return false, "orphan " + c.Name
			case c.Labels[rules.LabelOwnerUID] != string(trig.UID):
				return false, c.Name + " is not owned by its trigger's UID"
			case c.Data["v"] != trig.Data["v"]:
				return false, c.Name + " holds stale data"
			}
		}
		if len(got) != len(want) {
			return false, fmt.Sprintf("%d children, want %d", len(got), len(want))
		}
		return true, ""
	}
	var why string
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		ok, w := converged()
		why = w
		return ok, nil
	}); err != nil {
		t.Fatalf("the restarted syncloop did not converge: %s", why)
	}
	if err := second.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := second.Wait(); err != nil {
		t.Errorf("the restarted syncloop did not exit cleanly on SIGTERM: %v", err)
	}
}

// TestSecretsStayOutOfOutput runs the replicate example at -v=10 — the
// verbosity at which client-go would log every request and response body —
// through a Secret's whole life: copies made, the value changed, a copy
// edited and repaired, a copy pruned; then plans a further change. No
// Secret value, plain or base64, appears in the process's output, in the
// Events, or in the plan.
func TestSecretsStayOutOfOutput(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	nss := []string{newNamespace(t, cs, "secret"), newNamespace(t, cs, "secret"), newNamespace(t, cs, "secret")}
	src, dst1, dst2 := nss[0], nss[1], nss[2]
	values := []string{"s3cr3t-first-4242", "s3cr3t-second-8686", "s3cr3t-third-1357"}
	secrets := cs.CoreV1().Secrets(src)
	if _, err := secrets.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "db", Labels: map[string]string{"replicate": "true"},
			Annotations: map[string]string{"replicate-to": dst1 + "," + dst2}},
		Data: map[string][]byte{"password": []byte(values[0])},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	copyHolds := func(ns, value string) func() bool {
		return func() bool {
			s, err := cs.CoreV1().Secrets(ns).Get(ctx, "db", metav1.GetOptions{})
			return err == nil && string(s.Data["password"]) == value
		}
	}
	poll := func(what string, cond func() bool) { t.Helper(); pollUntil(t, 30*time.Second, what, cond) }
	rulesFile := filepath.Join(examplesDir, "replicate", "rules.yaml")
	proc := syncloopProcess(t, "syncloop", "run", "-v=10", "--events=all", "-f", rulesFile, "--kubeconfig", env.Kubeconfig(),
		"--metrics-bind-address=0", "--health-probe-bind-address=0")
	poll("the copies", func() bool { return copyHolds(dst1, values[0])() && copyHolds(dst2, values[0])() })

	if _, err := secrets.Patch(ctx, "db", types.MergePatchType,
		[]byte(fmt.Sprintf(`{"stringData":{"password":%q}}`, values[1])), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("the copies to follow the new value", func() bool { return copyHolds(dst1, values[1])() && copyHolds(dst2, values[1])() })
	if _, err := cs.CoreV1().Secrets(dst1).Patch(ctx, "db", types.MergePatchType,
		[]byte(`{"stringData":{"password":"edited"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("the edited copy to be repaired", copyHolds(dst1, values[1]))
	if _, err := secrets.Patch(ctx, "db", types.MergePatchType,
		[]byte(fmt.Sprintf(`{"metadata":{"annotations":{"replicate-to":%q}}}`, dst1)), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("the copy no longer wanted to be pruned", func() bool {
		_, err := cs.CoreV1().Secrets(dst2).Get(ctx, "db", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if err := proc.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := proc.Wait(); err != nil {
		t.Fatalf("syncloop run: %v", err)
	}
	logs, err := os.ReadFile(proc.Stdout.(*os.File).Name())
	if err != nil {
		t.Fatal(err)
	}
	// The run must have reached the verbosity at which bodies are logged.
	if !strings.Contains(string(logs), omittedBody) {
		t.Errorf("the -v=10 run logged no API body line:\n%s", tail(string(logs), 20))
	}

	// A plan of a further change shows that the Secret's data changes, not to what.
	if _, err := secrets.Patch(ctx, "db", types.MergePatchType,
		[]byte(fmt.Sprintf(`{"stringData":{"password":%q}}`, values[2])), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	code, plan, planErr := syncloop(t, "plan", "-f", rulesFile, "--kubeconfig", env.Kubeconfig())
	if code != 2 || !strings.Contains(plan, "update  v1 Secret "+dst1+"/db") || !strings.Contains(plan, "(redacted, sha256:") {
		t.Fatalf("plan exited %d, want 2 with an update of the copy:\n%s%s", code, plan, planErr)
	}

	var events strings.Builder
	for _, ns := range nss {
		list, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Items {
			fmt.Fprintf(&events, "%s %s %s\n", e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
	if !strings.Contains(events.String(), "Applied") {
		t.Fatalf("no Applied event was recorded:\n%s", events.String())
	}
	for _, out := range []struct{ name, text string }{
		{"the -v=10 log", string(logs)}, {"the Events", events.String()}, {"the plan", plan + planErr},
	} {
		for _, v := range values {
			for _, form := range []string{v, base64.StdEncoding.EncodeToString([]byte(v))} {
				if i := strings.Index(out.text, form); i >= 0 {
					t.Errorf("%s holds a Secret value: …%s…", out.name, out.text[max(0, i-200):min(len(out.text), i+50)])
				}
			}
		}
	}
}
