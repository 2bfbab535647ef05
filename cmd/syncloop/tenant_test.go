package main

import (
	"path/filepath"
	"strings"
	"testing"
)

const (
	tenantRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: app}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, labelSelector: app}
  lookups:
    - {id: creds, apiVersion: v1, kind: Secret, name: creds}
  resources:
    - id: settings
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-settings", namespace: "${object.?data.ns.orValue(object.metadata.namespace)}"}
        data: {secret: "${lookups.creds.metadata.name}"}
`
	tenantEscapes = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: escapes}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, labelSelector: app}
  lookups:
    - {id: creds, apiVersion: v1, kind: Secret, namespace: team-b, name: creds}
  resources:
    - id: settings
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: team-b}}
`
	tenantObjects = `apiVersion: v1
kind: ConfigMap
metadata: {name: web, namespace: team-a, labels: {app: web}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: sly, namespace: team-a, labels: {app: sly}}
data: {ns: team-b}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: other, namespace: team-b, labels: {app: other}}
---
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: team-a}
`
	tenantTest = `apiVersion: syncloop.dev/v1alpha1
kind: Test
metadata: {name: app}
rules: [rules.yaml]
objects: [objects.yaml]
expect:
  - rule: app
    trigger: {kind: ConfigMap, name: web, namespace: team-a}
    children:
      - {apiVersion: v1, kind: ConfigMap, metadata: {name: web-settings, namespace: team-a, labels: {syncloop.dev/rule: team-a.app}}, data: {secret: creds}}
  - rule: app
    trigger: {kind: ConfigMap, name: sly, namespace: team-a}
    error: 'stays in it: rendered "team-b"'
`
)

// TestTenantOffline: --tenant checks a team's rules as syncloop would
// read them from a ConfigMap in that namespace, without a cluster.
// validate rejects a lookup and a child in another namespace with their
// file:line:col (the same file as a platform rule is valid); render names
// the rule <namespace>.<name>, watches only the namespace and refuses per
// trigger a child whose namespace a trigger's field sends elsewhere; test
// names the rule as the file does.
func TestTenantOffline(t *testing.T) {
	dir := t.TempDir()
	good := writeFile(t, dir, "rules.yaml", tenantRule)
	bad := writeFile(t, t.TempDir(), "escapes.yaml", tenantEscapes)
	objects := writeFile(t, dir, "objects.yaml", tenantObjects)
	writeFile(t, dir, "test.yaml", tenantTest)

	if code, out, errOut := syncloop(t, "validate", "--tenant", "team-a", "-f", good); code != 0 || out != "1 rule(s) in 1 file(s) valid\n" {
		t.Errorf("validate --tenant of a confined rule: exit %d\n%s%s", code, out, errOut)
	}
	code, _, errOut := syncloop(t, "validate", "--tenant", "team-a", "-f", bad)
	for _, want := range []string{
		bad + `:7:60: rule "escapes": spec.lookups[0].namespace: a tenant rule of namespace "team-a" stays in it: it cannot read namespace "team-b"`,
		bad + `:10:82: rule "escapes": spec.resources[0].template.metadata.namespace: a tenant rule of namespace "team-a" stays in it: it cannot make or patch objects in namespace "team-b"`,
	} {
		if code != 1 || !strings.Contains(errOut, want) {
			t.Errorf("validate --tenant of a rule leaving its namespace: exit %d, want 1 and %q in\n%s", code, want, errOut)
		}
	}
	if code, out, errOut := syncloop(t, "validate", "-f", bad); code != 0 {
		t.Errorf("validate of the same rule as a platform rule: exit %d\n%s%s", code, out, errOut)
	}

	code, out, errOut := syncloop(t, "render", "--tenant", "team-a", "-f", good, "--objects", objects)
	if code != 1 || !strings.Contains(out, "name: web-settings") || !strings.Contains(out, "syncloop.dev/rule: team-a.app") ||
		strings.Contains(out, "other-settings") || !strings.Contains(errOut, `a tenant rule of namespace "team-a" stays in it: rendered "team-b"`) {
		t.Errorf("render --tenant: exit %d, want 1 with web's child, not other's, and sly refused\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if code, out, errOut := syncloop(t, "test", "--tenant", "team-a", filepath.Join(dir, "test.yaml")); code != 0 || !strings.Contains(out, "1 test(s): 1 passed") {
		t.Errorf("test --tenant: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, _ := syncloop(t, "test", filepath.Join(dir, "test.yaml")); code != 1 {
		t.Errorf("the tenant's test as a platform rule's: exit %d, want 1 (the child is not confined)\n%s", code, out)
	}
}
