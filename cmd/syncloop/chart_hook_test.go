package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/syncloop/syncloop/internal/testenv"
)

// runUninstallHook does what `helm uninstall` of release has its
// post-delete hook do, where no kubelet runs the hook's Job: it applies
// the hook's ServiceAccount and RBAC as Helm would, and runs the Job's
// container — syncloop with the Job's args — in process as that
// ServiceAccount. It returns the command's output; the test fails if it
// does not exit 0.
func runUninstallHook(t *testing.T, env *testenv.Env, release, namespace string) string {
	t.Helper()
	out, err := helmCmd(t, "get", "hooks", release, "-n", namespace, "--kubeconfig", env.Kubeconfig())
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var job *unstructured.Unstructured
	var rbac bytes.Buffer
	for _, o := range parseManifests(t, out) {
		if o.GetAnnotations()["helm.sh/hook"] != "post-delete" {
			continue
		}
		if o.GetKind() == "Job" {
			job = o
			continue
		}
		b, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		rbac.WriteString("---\n")
		rbac.Write(b)
	}
	if job == nil || rbac.Len() == 0 {
		t.Fatalf("no post-delete Job and RBAC among the release's hooks:\n%s", out)
	}
	path := filepath.Join(t.TempDir(), "hook.yaml")
	if err := os.WriteFile(path, rbac.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := applySamples(t.Context(), env, path); err != nil {
		t.Fatal(err)
	}
	sa, _, _ := unstructured.NestedString(job.Object, "spec", "template", "spec", "serviceAccountName")
	containers, _, _ := unstructured.NestedSlice(job.Object, "spec", "template", "spec", "containers")
	var args []string
	for _, a := range containers[0].(map[string]any)["args"].([]any) {
		args = append(args, a.(string))
	}
	cfg, err := env.ServiceAccountConfig(t.Context(), namespace, sa)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := testenv.WriteKubeconfig(kubeconfig, cfg, sa); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if code := runContext(t.Context(), append(args, "--kubeconfig", kubeconfig), &buf, &buf); code != 0 {
		t.Fatalf("the uninstall hook (%s) exited %d:\n%s", strings.Join(args, " "), code, buf.String())
	}
	return buf.String()
}
