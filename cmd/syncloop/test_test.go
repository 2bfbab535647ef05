package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExampleTests: every example has a test file, and they all pass.
func TestExampleTests(t *testing.T) {
	code, out, errOut := syncloop(t, "test", examplesDir)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, dir := range exampleDirs(t) {
		if !strings.Contains(out, "PASS "+filepath.Join(examplesDir, dir, "test.yaml")+": ") {
			t.Errorf("no passing test for %s:\n%s", dir, out)
		}
	}
}

// TestTestFailures: each kind of expectation fails when it does not hold,
// with the field and both values; a file error exits 2 with file:line:col.
func TestTestFailures(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("rules.yaml", `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: quota}
spec:
  watch: {apiVersion: v1, kind: Namespace}
  when: object.metadata.?labels.?tier.orValue('') != 'none'
  resources:
    - id: quota
      template:
        apiVersion: v1
        kind: ResourceQuota
        metadata: {name: quota, namespace: "${object.metadata.name}"}
        spec: {hard: {pods: "${object.metadata.labels.tier == 'gold' ? '100' : '10'}"}}
    - id: secret
      template:
        apiVersion: v1
        kind: Secret
        metadata: {name: s, namespace: "${object.metadata.name}"}
        stringData: {password: "${object.metadata.name}-secret"}
`)
	write("objects.yaml", `apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {tier: gold}}
---
apiVersion: v1
kind: Namespace
metadata: {name: idle, labels: {tier: none}}
---
apiVersion: v1
kind: Namespace
metadata: {name: broken}
`)
	tests := write("tests.yaml", `apiVersion: syncloop.dev/v1alpha1
kind: Test
metadata: {name: right}
rules: [rules.yaml]
objects: [objects.yaml]
expect:
  - rule: quota
    trigger: {kind: Namespace, name: shop}
    children:
      - {apiVersion: v1, kind: ResourceQuota, metadata: {name: quota, namespace: shop}, spec: {hard: {pods: "100"}}}
    absent: [{kind: ConfigMap, name: quota}]
  - {rule: quota, trigger: {kind: Namespace, name: idle}, skipped: true}
  - {rule: quota, trigger: {kind: Namespace, name: broken}, error: "no such key: labels"}
---
apiVersion: syncloop.dev/v1alpha1
kind: Test
metadata: {name: wrong}
rules: [rules.yaml]
objects: [objects.yaml]
expect:
  - rule: quota
    trigger: {kind: Namespace, name: shop}
    children:
      - {apiVersion: v1, kind: ResourceQuota, metadata: {name: quota, namespace: shop}, spec: {hard: {pods: "50", cpu: "4"}}}
      - {apiVersion: v1, kind: Secret, metadata: {name: s, namespace: shop}, stringData: {password: hunter2}}
      - {kind: LimitRange, metadata: {name: limits}}
    absent: [{kind: ResourceQuota, name: quota}]
  - {rule: quota, trigger: {kind: Namespace, name: idle}, skipped: false}
  - {rule: quota, trigger: {kind: Namespace, name: broken}, error: "forbidden"}
  - {rule: quoat, trigger: {kind: Namespace, name: shop}}
`)
	code, out, _ := syncloop(t, "test", tests)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	for _, want := range []string{
		"PASS " + tests + ": right\n",
		"FAIL " + tests + ": wrong\n",
		`children[0] v1 ResourceQuota shop/quota: spec.hard.cpu: want "4", not rendered`,
		`children[0] v1 ResourceQuota shop/quota: spec.hard.pods: want "50", rendered "100"`,
		`children[1] v1 Secret shop/s: stringData.password: want (redacted, sha256:f52fbd32), rendered (redacted, sha256:`,
		`children[2]: LimitRange limits not rendered (rendered: v1 ResourceQuota shop/quota, v1 Secret shop/s)`,
		`absent[0]: v1 ResourceQuota shop/quota rendered`,
		`want skipped: false (when), rendered skipped: true`,
		`want an error containing "forbidden", got: `,
		`expect[3] (rule quoat, trigger Namespace shop): no such rule (rules: quota)`,
		"2 test(s): 1 passed, 1 failed\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "hunter2") || strings.Contains(out, "shop-secret") {
		t.Errorf("a Secret value in the output:\n%s", out)
	}

	// A file error: exit 2, with where.
	bad := write("bad.yaml", "apiVersion: syncloop.dev/v1alpha1\nkind: Test\nmetadata: {name: bad}\nrules: [rules.yaml]\nobjects: [objects.yaml]\nexpect:\n  - {rule: quota, trigger: {kind: Namespace, name: shop}, childern: []}\n")
	code, _, errOut := syncloop(t, "test", bad)
	if want := bad + `:7:59: expect[0]: unknown field "childern" (did you mean "children"?)`; code != 2 || !strings.Contains(errOut, want) {
		t.Errorf("file error: exit %d, stderr %q; want 2 and %q", code, errOut, want)
	}
}
