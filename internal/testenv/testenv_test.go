package testenv

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	applycorev1 "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

func TestMain(m *testing.M) { Main(m, Options{ControllerManager: true}) }

var widgetGVR = schema.GroupVersionResource{Group: "test.syncloop.dev", Version: "v1", Resource: "widgets"}

// clients returns typed and dynamic clients for the admin identity and a
// fresh namespace for the test.
func clients(t *testing.T, env *Env) (kubernetes.Interface, dynamic.Interface, string) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "smoke-"}}
	ns, err = cs.CoreV1().Namespaces().Create(t.Context(), ns, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cs, dc, ns.Name
}

func TestServerVersion(t *testing.T) {
	env := Get(t)
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != KubeVersion {
		t.Errorf("server reports %q, want %q (version ldflags missing from the build?)", v.GitVersion, KubeVersion)
	}
}

func TestCRDStatusSubresource(t *testing.T) {
	env := Get(t)
	ctx := t.Context()
	_, dc, ns := clients(t, env)

	names, err := env.InstallCRDs(ctx, filepath.Join("testdata", "widgets-crd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 1 || names[0] != "widgets.test.syncloop.dev" {
		t.Fatalf("installed %v, want [widgets.test.syncloop.dev]", names)
	}

	w := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.syncloop.dev/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "w1"},
		"spec":     map[string]any{"size": int64(3)},
		"status":   map[string]any{"ready": true},
	}}
	created, err := dc.Resource(widgetGVR).Namespace(ns).Create(ctx, w, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// With the status subresource enabled, the main resource ignores status.
	if _, found, _ := unstructured.NestedBool(created.Object, "status", "ready"); found {
		t.Fatalf("create kept .status; the status subresource is not in effect: %v", created.Object["status"])
	}

	if err := unstructured.SetNestedField(created.Object, true, "status", "ready"); err != nil {
		t.Fatal(err)
	}
	if _, err := dc.Resource(widgetGVR).Namespace(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := dc.Resource(widgetGVR).Namespace(ns).Get(ctx, "w1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ready, _, _ := unstructured.NestedBool(got.Object, "status", "ready"); !ready {
		t.Errorf("status.ready = false after writing /status, want true")
	}
	if size, _, _ := unstructured.NestedInt64(got.Object, "spec", "size"); size != 3 {
		t.Errorf("spec.size = %d, want 3", size)
	}
}

func TestServerSideApplyFieldManager(t *testing.T) {
	env := Get(t)
	ctx := t.Context()
	cs, _, ns := clients(t, env)

	cm := applycorev1.ConfigMap("applied", ns).WithData(map[string]string{"k": "v"})
	if _, err := cs.CoreV1().ConfigMaps(ns).Apply(ctx, cm, metav1.ApplyOptions{FieldManager: "syncloop/smoke"}); err != nil {
		t.Fatal(err)
	}
	got, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "applied", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Data["k"] != "v" {
		t.Errorf("data = %v, want k=v", got.Data)
	}
	var managers []string
	found := false
	for _, mf := range got.ManagedFields {
		managers = append(managers, fmt.Sprintf("%s/%s", mf.Manager, mf.Operation))
		if mf.Manager == "syncloop/smoke" && mf.Operation == metav1.ManagedFieldsOperationApply {
			found = true
			if !strings.Contains(mf.FieldsV1.GetRawString(), `"f:k"`) {
				t.Errorf("manager syncloop/smoke does not own data.k: %s", mf.FieldsV1.GetRawString())
			}
		}
	}
	if !found {
		t.Errorf("managedFields %v lack syncloop/smoke/Apply", managers)
	}
}

func TestGarbageCollection(t *testing.T) {
	env := Get(t)
	ctx := t.Context()
	cs, _, ns := clients(t, env)

	owner, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	child := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: "child",
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID,
		}},
	}}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, child, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().ConfigMaps(ns).Delete(ctx, owner.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "child", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("child with an ownerReference to a deleted owner was not garbage-collected: %v", err)
	}
}

func TestServiceAccountRBAC(t *testing.T) {
	env := Get(t)
	ctx := t.Context()
	cs, _, ns := clients(t, env)

	cfg, err := env.ServiceAccountConfig(ctx, ns, "limited")
	if err != nil {
		t.Fatal(err)
	}
	limited, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := limited.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("listing ConfigMaps without a RoleBinding: err = %v, want Forbidden", err)
	}

	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "cm-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list"}}},
	}
	if _, err := cs.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "cm-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "cm-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "limited"}},
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// RBAC changes reach the authorizer through its informers: poll.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := limited.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("ServiceAccount still cannot list ConfigMaps after the RoleBinding: %v", err)
	}
	if _, err := limited.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing ConfigMaps in another namespace: err = %v, want Forbidden", err)
	}
	if _, err := limited.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("creating a ConfigMap with list rights only: err = %v, want Forbidden", err)
	}

	imp := env.ImpersonatedConfig("system:serviceaccount:"+ns+":limited", "system:serviceaccounts")
	impCS, err := kubernetes.NewForConfig(imp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := impCS.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("impersonating the ServiceAccount, listing ConfigMaps: %v", err)
	}
	if _, err := impCS.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("impersonating the ServiceAccount, listing Secrets: err = %v, want Forbidden", err)
	}
}

// helperEnv makes the test binary, run as a child by
// TestNoProcessOutlivesKilledTestBinary, start a control plane, print its
// process IDs and wait to be killed.
const helperEnv = "SYNCLOOP_TESTENV_HELPER"

func TestHelperStartAndHang(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper for TestNoProcessOutlivesKilledTestBinary")
	}
	env, err := Start(t.Context(), Options{ControllerManager: true})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("pids %d %d %d %s\n", env.etcd.cmd.Process.Pid, env.apiServer.cmd.Process.Pid, env.kcm.cmd.Process.Pid, env.Dir())
	select {} // until killed
}

// TestNoProcessOutlivesKilledTestBinary SIGKILLs a test binary that runs a
// control plane — no deferred cleanup can run — and checks that etcd,
// kube-apiserver and kube-controller-manager die with it.
func TestNoProcessOutlivesKilledTestBinary(t *testing.T) {
	Get(t) // binaries are there; skips under -short
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperStartAndHang$", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pids []int
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "pids "); ok {
			fields := strings.Fields(rest)
			for _, f := range fields[:len(fields)-1] {
				pid, _ := strconv.Atoi(f)
				pids = append(pids, pid)
			}
			// The killed helper cannot remove its scratch directory.
			t.Cleanup(func() { os.RemoveAll(fields[len(fields)-1]) })
			break
		}
	}
	if len(pids) != 3 {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper printed pids %v, want 3", pids)
	}
	for _, pid := range pids {
		if !alive(pid) {
			t.Fatalf("pid %d not running while the helper runs", pid)
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()

	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		for _, pid := range pids {
			if alive(pid) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		for _, pid := range pids {
			if alive(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		t.Fatalf("control plane processes outlived the killed test binary: %v", pids)
	}
}

func TestStopRemovesProcessesAndDir(t *testing.T) {
	Get(t)
	env, err := Start(t.Context(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	pids := []int{env.etcd.cmd.Process.Pid, env.apiServer.cmd.Process.Pid}
	dir := env.Dir()
	env.Stop()
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("pid %d still running after Stop", pid)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("scratch dir %s still exists after Stop (err %v)", dir, err)
	}
}

// alive reports whether pid runs and is not a zombie.
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// Format: pid (comm) state ...; comm may hold spaces, so cut at the last ')'.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}
