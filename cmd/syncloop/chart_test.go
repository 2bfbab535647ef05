package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
)

const chartDir = "../../charts/syncloop"

// helmCmd runs helm 3.
func helmCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return runHelm(t, testenv.Helm, args...)
}

func runHelm(t *testing.T, find func() (string, error), args ...string) (string, error) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs helm, built by hack/testenv.sh")
	}
	helm, err := find()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(helm, args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), nil
}

func TestChartLint(t *testing.T) {
	if out, err := helmCmd(t, "lint", "--strict", chartDir); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// rendered is helm template's output, by kind and name.
type rendered map[string]*unstructured.Unstructured

func (r rendered) get(t *testing.T, kind, name string) *unstructured.Unstructured {
	t.Helper()
	o := r[kind+"/"+name]
	if o == nil {
		t.Fatalf("no %s %s rendered; have %v", kind, name, keys(r))
	}
	return o
}

func keys(r rendered) []string {
	var k []string
	for n := range r {
		k = append(k, n)
	}
	return k
}

func template(t *testing.T, args ...string) rendered {
	t.Helper()
	out, err := helmCmd(t, append([]string{"template", "rel", chartDir, "-n", "syncloop-system", "--include-crds"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return parseManifests(t, out)
}

func parseManifests(t *testing.T, out string) rendered {
	t.Helper()
	r := rendered{}
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return r
			}
			t.Fatal(err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		r[u.GetKind()+"/"+u.GetName()] = u
	}
}

func podSpec(t *testing.T, r rendered) corev1.PodSpec { return podSpecOf(t, r, "rel-syncloop") }

func podSpecOf(t *testing.T, r rendered, deployment string) corev1.PodSpec {
	t.Helper()
	var d struct {
		Spec struct {
			Template corev1.PodTemplateSpec `json:"template"`
		} `json:"spec"`
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(r.get(t, "Deployment", deployment).Object, &d); err != nil {
		t.Fatal(err)
	}
	return d.Spec.Template.Spec
}

func TestChartTemplate(t *testing.T) {
	tenant := "rules.tenant\\.yaml=../../examples/tenant-defaults/rules.yaml"

	t.Run("defaults", func(t *testing.T) {
		r := template(t, "--set-file", tenant)
		dep := r.get(t, "Deployment", "rel-syncloop")
		if n, _, _ := unstructured.NestedFieldNoCopy(dep.Object, "spec", "replicas"); fmt.Sprint(n) != "2" {
			t.Errorf("replicas %v, want 2", n)
		}
		spec := podSpec(t, r)
		c := spec.Containers[0]
		args := strings.Join(c.Args, " ")
		for _, want := range []string{"run", "--rules=/etc/syncloop/rules", "--rules-configmap=syncloop-system/rel-syncloop-rules", "--leader-elect", "--leader-elect-namespace=syncloop-system", "--metrics-bind-address=:8080", "--health-probe-bind-address=:8081"} {
			if !strings.Contains(args, want) {
				t.Errorf("args %q lack %q", args, want)
			}
		}
		if strings.Contains(args, "--dry-run") {
			t.Error("--dry-run by default")
		}
		if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/etc/syncloop/rules" || c.VolumeMounts[0].SubPath != "" {
			t.Errorf("rules mount %+v: want the directory, never subPath", c.VolumeMounts)
		}
		if spec.Volumes[0].ConfigMap == nil || spec.Volumes[0].ConfigMap.Name != "rel-syncloop-rules" {
			t.Errorf("rules volume %+v", spec.Volumes)
		}
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" ||
			sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("container securityContext is not Pod Security restricted: %+v", sc)
		}
		if c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
			t.Errorf("probes %v %v", c.LivenessProbe.HTTPGet.Path, c.ReadinessProbe.HTTPGet.Path)
		}
		cm := r.get(t, "ConfigMap", "rel-syncloop-rules")
		data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
		want, _ := os.ReadFile("../../examples/tenant-defaults/rules.yaml")
		if strings.TrimSpace(data["tenant.yaml"]) != strings.TrimSpace(string(want)) {
			t.Errorf("the rules ConfigMap does not hold the rule file as given:\n%s", data["tenant.yaml"])
		}
		if _, ok := data["existingConfigMap"]; ok {
			t.Error("a setting of rules rendered as a rule file")
		}
		cr := r.get(t, "ClusterRole", "rel-syncloop")
		if !strings.Contains(fmt.Sprint(cr.Object["rules"]), "apiGroups:[*]") {
			t.Errorf("unrestricted ClusterRole rules %v", cr.Object["rules"])
		}
		r.get(t, "Role", "rel-syncloop-leader-election")
		if rules := fmt.Sprint(r.get(t, "Role", "rel-syncloop-self").Object["rules"]); !strings.Contains(rules, "resources:[controllerrevisions] verbs:[get list watch create update patch delete]") ||
			!strings.Contains(rules, "resourceNames:[rel-syncloop-rules] resources:[configmaps] verbs:[get]") {
			t.Errorf("the Role of syncloop's own objects: rules %v", rules)
		}
		r.get(t, "RoleBinding", "rel-syncloop-self")
		r.get(t, "ServiceAccount", "rel-syncloop")
		r.get(t, "Service", "rel-syncloop-metrics")
		r.get(t, "Pod", "rel-syncloop-validate-rules")
		for _, absent := range []string{"ServiceMonitor/rel-syncloop"} {
			if r[absent] != nil {
				t.Errorf("%s rendered by default", absent)
			}
		}
		// Two replicas: one kept through drains, for the conversion
		// webhook every replica serves (not ready ones too).
		if pdb := r.get(t, "PodDisruptionBudget", "rel-syncloop"); fmt.Sprint(pdb.Object["spec"].(map[string]any)["minAvailable"]) != "1" {
			t.Errorf("PodDisruptionBudget %v", pdb.Object["spec"])
		}
		if svc := r.get(t, "Service", "rel-syncloop-webhook"); svc.Object["spec"].(map[string]any)["publishNotReadyAddresses"] != true {
			t.Errorf("the webhook Service does not publish replicas not ready: %v", svc.Object["spec"])
		}
		// The Secret syncloop names for its installation (rel), made by
		// the chart so that syncloop needs no right to create Secrets.
		if rules := fmt.Sprint(r.get(t, "Role", "rel-syncloop-webhook").Object["rules"]); rules != "[map[apiGroups:[] resourceNames:[syncloop-rel-webhook-tls] resources:[secrets] verbs:[get list watch update]]]" {
			t.Errorf("the webhook's Role: %s; want its Secret alone, no create", rules)
		}
		r.get(t, "Secret", "syncloop-rel-webhook-tls")
		if args := fmt.Sprint(r.get(t, "Deployment", "rel-syncloop").Object["spec"]); !strings.Contains(args, "--webhook-bind-address=:9443") || !strings.Contains(args, "--webhook-service=syncloop-system/rel-syncloop-webhook:443") {
			t.Errorf("the Deployment does not serve the webhook behind its Service")
		}
		// cert-manager's: a Certificate into the same Secret, a
		// self-signed Issuer, syncloop told, and its Secret read only.
		viaCM := template(t, "--set", "webhook.certManager.enabled=true")
		cert := viaCM.get(t, "Certificate", "rel-syncloop-webhook")
		if spec := fmt.Sprint(cert.Object["spec"]); !strings.Contains(spec, "secretName:syncloop-rel-webhook-tls") || !strings.Contains(spec, "rel-syncloop-webhook.syncloop-system.svc") {
			t.Errorf("the Certificate: %s", spec)
		}
		viaCM.get(t, "Issuer", "rel-syncloop-webhook")
		if viaCM["Secret/syncloop-rel-webhook-tls"] != nil {
			t.Error("the chart makes the Secret cert-manager issues")
		}
		if args := fmt.Sprint(viaCM.get(t, "Deployment", "rel-syncloop").Object["spec"]); !strings.Contains(args, "--webhook-cert-manager=syncloop-system/rel-syncloop-webhook") {
			t.Error("syncloop is not told the Certificate")
		}
		if rules := fmt.Sprint(viaCM.get(t, "Role", "rel-syncloop-webhook").Object["rules"]); !strings.Contains(rules, "verbs:[get list watch]]") {
			t.Errorf("with cert-manager, syncloop may write its Secret: %s", rules)
		}
		// A client CA: off by default; on, mounted as a directory from the
		// ConfigMap named and passed to --webhook-client-ca.
		if args := fmt.Sprint(r.get(t, "Deployment", "rel-syncloop").Object["spec"]); strings.Contains(args, "webhook-client-ca") {
			t.Error("a client CA required by default")
		}
		withCA := fmt.Sprint(template(t, "--set", "webhook.clientCA.configMap=apiserver-ca").get(t, "Deployment", "rel-syncloop").Object["spec"])
		for _, want := range []string{"--webhook-client-ca=/etc/syncloop/webhook-client-ca/ca.crt", "mountPath:/etc/syncloop/webhook-client-ca",
			"configMap:map[name:apiserver-ca] name:webhook-client-ca"} {
			if !strings.Contains(withCA, want) {
				t.Errorf("with webhook.clientCA.configMap, the Deployment lacks %s: %s", want, withCA)
			}
		}
	})

	t.Run("CRDs of the kinds rules define", func(t *testing.T) {
		restricted := []string{"--set-file", tenant, "--set", "rbac.mode=restricted",
			"--set", "rbac.rules[0].apiGroups[0]=", "--set", "rbac.rules[0].resources[0]=namespaces", "--set", "rbac.rules[0].verbs[0]=list",
			"--set", "rbac.crds[0]=apps.example.syncloop.dev"}
		rules := fmt.Sprint(template(t, restricted...).get(t, "ClusterRole", "rel-syncloop").Object["rules"])
		for _, want := range []string{"resources:[customresourcedefinitions] verbs:[create]",
			"resourceNames:[apps.example.syncloop.dev] resources:[customresourcedefinitions] verbs:[get patch update]"} {
			if !strings.Contains(rules, want) {
				t.Errorf("restricted ClusterRole rules %v lack %s", rules, want)
			}
		}
		r := template(t, append(restricted, "--set", "manageCRDs=false")...)
		rules = fmt.Sprint(r.get(t, "ClusterRole", "rel-syncloop").Object["rules"])
		if strings.Contains(rules, "verbs:[create]") || !strings.Contains(rules, "resourceNames:[apps.example.syncloop.dev] resources:[customresourcedefinitions] verbs:[get]") {
			t.Errorf("manageCRDs=false: ClusterRole rules %v", rules)
		}
		if args := strings.Join(podSpec(t, r).Containers[0].Args, " "); !strings.Contains(args, "--manage-crds=false") {
			t.Errorf("manageCRDs=false: args %s", args)
		}
		if args := strings.Join(podSpec(t, template(t, "--set-file", tenant)).Containers[0].Args, " "); strings.Contains(args, "manage-crds") {
			t.Errorf("by default: args %s", args)
		}
	})

	t.Run("restricted RBAC", func(t *testing.T) {
		r := template(t, "--set-file", tenant, "--set", "rbac.mode=restricted",
			"--set", "rbac.rules[0].apiGroups[0]=", "--set", "rbac.rules[0].resources[0]=namespaces", "--set", "rbac.rules[0].verbs[0]=list")
		rules := fmt.Sprint(r.get(t, "ClusterRole", "rel-syncloop").Object["rules"])
		if strings.Contains(rules, "apiGroups:[*]") || !strings.Contains(rules, "resources:[namespaces]") ||
			!strings.Contains(rules, "resources:[customresourcedefinitions] verbs:[list watch]") {
			t.Errorf("restricted ClusterRole rules %v", rules)
		}
		if _, err := helmCmd(t, "template", "rel", chartDir, "--set", "rbac.mode=restricted"); err == nil || !strings.Contains(err.Error(), "rbac.mode restricted needs rbac.rules") {
			t.Errorf("restricted without rules: %v", err)
		}
	})

	t.Run("rules act as a ServiceAccount", func(t *testing.T) {
		r := template(t, "--set-file", tenant, "--set", "identity.defaultServiceAccount=rules", "--set", "identity.serviceAccounts[0]=team-a/deployer")
		if args := strings.Join(podSpec(t, r).Containers[0].Args, " "); !strings.Contains(args, "--default-service-account=syncloop-system/rules") {
			t.Errorf("args %s", args)
		}
		own := fmt.Sprint(r.get(t, "ClusterRole", "rel-syncloop").Object["rules"])
		if strings.Contains(own, "apiGroups:[*]") || !strings.Contains(own, "resources:[events]") {
			t.Errorf("syncloop's own ClusterRole %v: want Events and CRDs, not the rules' rights", own)
		}
		if rights := fmt.Sprint(r.get(t, "ClusterRole", "rel-syncloop-rules").Object["rules"]); !strings.Contains(rights, "apiGroups:[*]") {
			t.Errorf("the rules' ClusterRole %v", rights)
		}
		if subj := fmt.Sprint(r.get(t, "ClusterRoleBinding", "rel-syncloop-rules").Object["subjects"]); !strings.Contains(subj, "name:rules namespace:syncloop-system") {
			t.Errorf("the rules' rights are bound to %v", subj)
		}
		r.get(t, "ServiceAccount", "rules")
		for _, as := range []struct{ name, ns string }{{"rules", "syncloop-system"}, {"deployer", "team-a"}} {
			role := r.get(t, "Role", "rel-syncloop-as-"+as.name)
			if role.GetNamespace() != as.ns || fmt.Sprint(role.Object["rules"]) != "[map[apiGroups:[] resourceNames:["+as.name+"] resources:[serviceaccounts] verbs:[impersonate]]]" {
				t.Errorf("impersonation Role %s: %v %v", as.name, role.GetNamespace(), role.Object["rules"])
			}
			r.get(t, "RoleBinding", "rel-syncloop-as-"+as.name)
		}
		// Without an identity, nothing of it.
		plain := template(t, "--set-file", tenant)
		for _, k := range []string{"ClusterRole/rel-syncloop-rules", "Role/rel-syncloop-as-rules", "ServiceAccount/rules"} {
			if plain[k] != nil {
				t.Errorf("%s rendered without identity.defaultServiceAccount", k)
			}
		}
		if _, err := helmCmd(t, "template", "rel", chartDir, "--set", "identity.serviceAccounts[0]=deployer"); err == nil {
			t.Error("identity.serviceAccounts took a name without namespace")
		}
	})

	t.Run("one namespace", func(t *testing.T) {
		r := template(t, "--set-file", tenant, "--set", "watchNamespace=team")
		if args := strings.Join(podSpec(t, r).Containers[0].Args, " "); !strings.Contains(args, "--watch-namespace=team") {
			t.Errorf("args %q lack --watch-namespace=team", args)
		}
		for _, kind := range []string{"Role", "RoleBinding"} {
			if ns := r.get(t, kind, "rel-syncloop").GetNamespace(); ns != "team" {
				t.Errorf("%s in namespace %q, want team", kind, ns)
			}
		}
		for key := range r {
			if strings.HasPrefix(key, "Cluster") {
				t.Errorf("%s rendered: with watchNamespace syncloop needs no cluster-wide rights", key)
			}
		}
		if _, err := helmCmd(t, "template", "rel", chartDir, "--set", "watchNamespace=Team_A"); err == nil {
			t.Error("an invalid namespace name was accepted")
		}
	})

	t.Run("existing ConfigMap", func(t *testing.T) {
		r := template(t, "--set", "rules.existingConfigMap=my-rules")
		if r["ConfigMap/rel-syncloop-rules"] != nil {
			t.Error("a rules ConfigMap rendered although existingConfigMap is set")
		}
		if v := podSpec(t, r).Volumes[0].ConfigMap.Name; v != "my-rules" {
			t.Errorf("volume uses %q, want my-rules", v)
		}
	})

	t.Run("functions", func(t *testing.T) {
		module := base64.StdEncoding.EncodeToString([]byte("\x00asm\x01\x00\x00\x00"))
		r := template(t, "--set-file", tenant, "--set", "functions.fn\\.wasm="+module+",rules.rolloutOnChange=true")
		cm := r.get(t, "ConfigMap", "rel-syncloop-rules")
		if got, _, _ := unstructured.NestedString(cm.Object, "binaryData", "fn.wasm"); got != module {
			t.Errorf("binaryData fn.wasm = %q, want the module", got)
		}
		plain := template(t, "--set-file", tenant, "--set", "rules.rolloutOnChange=true")
		sum := func(r rendered) string {
			v, _, _ := unstructured.NestedString(r.get(t, "Deployment", "rel-syncloop").Object, "spec", "template", "metadata", "annotations", "syncloop.dev/rules-checksum")
			return v
		}
		if sum(r) == "" || sum(r) == sum(plain) {
			t.Error("a module's change does not change the rules' checksum: the pods would not roll")
		}
		if _, err := helmCmd(t, "template", "rel", chartDir, "--set", "functions.fn\\.txt=eA=="); err == nil {
			t.Error("a function file not named .wasm or .wasm.gz was accepted")
		}
	})

	t.Run("dry run, log level, extra args, rollout on change", func(t *testing.T) {
		r := template(t, "--set-file", tenant, "--set", "dryRun=true,logLevel=3,rules.rolloutOnChange=true,leaderElection.enabled=false", "--set", "extraArgs[0]=--qps=20")
		args := strings.Join(podSpec(t, r).Containers[0].Args, " ")
		for _, want := range []string{"--dry-run", "-v=3", "--qps=20"} {
			if !strings.Contains(args, want) {
				t.Errorf("args %q lack %q", args, want)
			}
		}
		if strings.Contains(args, "--leader-elect") || r["Role/rel-syncloop-leader-election"] != nil {
			t.Error("leader election rendered although disabled")
		}
		sum := func(r rendered) string {
			v, _, _ := unstructured.NestedString(r.get(t, "Deployment", "rel-syncloop").Object, "spec", "template", "metadata", "annotations", "syncloop.dev/rules-checksum")
			return v
		}
		first := sum(r)
		other := template(t, "--set-file", "rules.tenant\\.yaml=../../examples/app/rules.yaml", "--set", "rules.rolloutOnChange=true")
		if first == "" || first == sum(other) {
			t.Errorf("rules checksum %q does not follow the rules (%q)", first, sum(other))
		}
	})

	t.Run("sharding", func(t *testing.T) {
		r := template(t, "--set", "sharding.enabled=true,replicaCount=3")
		args := strings.Join(podSpec(t, r).Containers[0].Args, " ")
		for _, want := range []string{"--sharding", "--leader-elect-namespace=syncloop-system", "--leader-elect-id=rel-syncloop"} {
			if !strings.Contains(args, want) {
				t.Errorf("args %q lack %q", args, want)
			}
		}
		if strings.Contains(args, "--leader-elect ") || r["Role/rel-syncloop-leader-election"] != nil {
			t.Errorf("leader election rendered with sharding: %q", args)
		}
		if n, _, _ := unstructured.NestedFieldNoCopy(r.get(t, "Deployment", "rel-syncloop").Object, "spec", "replicas"); fmt.Sprint(n) != "3" {
			t.Errorf("replicas = %v, want 3", n)
		}
		rules, _, _ := unstructured.NestedSlice(r.get(t, "Role", "rel-syncloop-sharding").Object, "rules")
		if got := fmt.Sprint(rules); !strings.Contains(got, "verbs:[get list watch create update delete]") || !strings.Contains(got, "resources:[leases]") {
			t.Errorf("the sharding Role grants %s", got)
		}
		r.get(t, "RoleBinding", "rel-syncloop-sharding")
	})

	t.Run("clusters", func(t *testing.T) {
		r := template(t)
		if args := strings.Join(podSpec(t, r).Containers[0].Args, " "); strings.Contains(args, "--clusters-namespace") || r["Role/rel-syncloop-clusters"] != nil {
			t.Errorf("the cluster inventory rendered although disabled: %q", args)
		}
		r = template(t, "--set", "clusters.enabled=true,clusters.namespace=fleet")
		if args := strings.Join(podSpec(t, r).Containers[0].Args, " "); !strings.Contains(args, "--clusters-namespace=fleet") || strings.Contains(args, "--insecure-kubeconfig") {
			t.Errorf("args %q: want --clusters-namespace=fleet and no --insecure-kubeconfig-* flag by default", args)
		}
		insecure := template(t, "--set", "clusters.enabled=true,clusters.insecureKubeconfigExec=true,clusters.insecureKubeconfigTLS=true,clusters.insecureKubeconfigProxy=true")
		if args := strings.Join(podSpec(t, insecure).Containers[0].Args, " "); !strings.Contains(args, "--insecure-kubeconfig-exec --insecure-kubeconfig-tls --insecure-kubeconfig-proxy") {
			t.Errorf("args %q lack the --insecure-kubeconfig-* flags their values turn on", args)
		}
		role := r.get(t, "Role", "rel-syncloop-clusters")
		rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
		if got := fmt.Sprint(rules); role.GetNamespace() != "fleet" || !strings.Contains(got, "resources:[secrets] verbs:[get list watch]") || strings.Contains(got, "create list") {
			t.Errorf("the inventory Role in %q grants %s: want get, list, watch on Secrets in fleet only", role.GetNamespace(), got)
		}
		if b := r.get(t, "RoleBinding", "rel-syncloop-clusters"); b.GetNamespace() != "fleet" {
			t.Errorf("the inventory RoleBinding is in %q", b.GetNamespace())
		}
		if args := strings.Join(podSpec(t, template(t, "--set", "clusters.enabled=true")).Containers[0].Args, " "); !strings.Contains(args, "--clusters-namespace=syncloop-system") {
			t.Errorf("args %q: want the release namespace by default", args)
		}
	})

	t.Run("flow control and events", func(t *testing.T) {
		args := strings.Join(podSpec(t, template(t)).Containers[0].Args, " ")
		if strings.Contains(args, "--qps") || strings.Contains(args, "--burst") || !strings.Contains(args, "--events=warnings") {
			t.Errorf("default args %q: want no client-side cap and --events=warnings", args)
		}
		args = strings.Join(podSpec(t, template(t, "--set", "qps=200,burst=300,events=all")).Containers[0].Args, " ")
		for _, want := range []string{"--qps=200", "--burst=300", "--events=all"} {
			if !strings.Contains(args, want) {
				t.Errorf("args %q lack %q", args, want)
			}
		}
	})

	t.Run("GOMEMLIMIT from the memory limit", func(t *testing.T) {
		env := podSpec(t, template(t)).Containers[0].Env
		if len(env) != 1 || env[0].Name != "GOMEMLIMIT" || env[0].ValueFrom == nil || env[0].ValueFrom.ResourceFieldRef == nil ||
			env[0].ValueFrom.ResourceFieldRef.Resource != "limits.memory" {
			t.Errorf("env %+v: want GOMEMLIMIT from limits.memory", env)
		}
		if env := podSpec(t, template(t, "--set", "resources.limits=null")).Containers[0].Env; len(env) != 0 {
			t.Errorf("env %+v without a memory limit, want none", env)
		}
	})

	t.Run("ServiceMonitor and PodDisruptionBudget", func(t *testing.T) {
		r := template(t, "--set", "metrics.serviceMonitor.enabled=true,podDisruptionBudget.enabled=true")
		r.get(t, "ServiceMonitor", "rel-syncloop")
		r.get(t, "PodDisruptionBudget", "rel-syncloop")
	})

	t.Run("installation", func(t *testing.T) {
		if args := strings.Join(podSpec(t, template(t)).Containers[0].Args, " "); !strings.Contains(args, "--installation=rel") {
			t.Errorf("default args %q lack --installation=rel (the release's name)", args)
		}
		if args := strings.Join(podSpec(t, template(t, "--set", "installation=platform")).Containers[0].Args, " "); !strings.Contains(args, "--installation=platform") {
			t.Errorf("args %q lack --installation=platform", args)
		}
		if _, err := helmCmd(t, "template", "rel", chartDir, "--set", "installation=Team_A"); err == nil {
			t.Error("an installation name that is no label value was accepted")
		}
	})

	t.Run("typos rejected", func(t *testing.T) {
		for _, set := range []string{"replicaCont=3", "rbac.mode=open", "rules.notes\\.txt=x", "image.pullPolicy=Sometimes", "events=none", "qps=-1", "metrics.servicemonitor.enabled=true"} {
			if _, err := helmCmd(t, "template", "rel", chartDir, "--set", set); err == nil {
				t.Errorf("--set %s was accepted", set)
			}
		}
	})
}

// TestChartInstall installs the chart into the local API server, in a
// namespace that enforces Pod Security "restricted", then runs syncloop out
// of cluster as the chart's ServiceAccount with the rules from the installed
// ConfigMap: the chart's RBAC must be enough for the bundled examples. It
// then does the same with rbac.mode=restricted and exactly the rules the
// tenant example needs.
func TestChartInstall(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	newNS := func(name string) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}}
		if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	newNS("syncloop-system")
	examples := []string{"tenant-defaults", "replicate", "app", "namespace-metadata", "pull-secret", "team-network-policy", "namespace-label", "ci-robot", "catalogue"}
	// The rules in a ConfigMap made beside the chart (rules.existingConfigMap),
	// as a Go function's module asks: Helm's release Secret, which holds
	// the values and the manifest, cannot hold a megabyte's module twice.
	rulesCM := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "syncloop-rules"}, Data: map[string]string{}, BinaryData: map[string][]byte{}}
	for _, ex := range examples {
		data, err := os.ReadFile(filepath.Join("../../examples", ex, "rules.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		rulesCM.Data[ex+".yaml"] = string(data)
	}
	if rulesCM.BinaryData["catalogue.wasm.gz"], err = os.ReadFile("../../examples/catalogue/catalogue.wasm.gz"); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps("syncloop-system").Create(ctx, rulesCM, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	args := []string{"install", "syncloop", chartDir, "-n", "syncloop-system", "--kubeconfig", env.Kubeconfig(), "--set", "rules.existingConfigMap=syncloop-rules"}
	if out, err := helmCmd(t, args...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	manifest, err := helmCmd(t, "get", "manifest", "syncloop", "-n", "syncloop-system", "--kubeconfig", env.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	// No pod runs here (no scheduler or kubelet): check the Deployment's pod
	// as Pod Security admission would see it, and that enforcement is on.
	spec := podSpecOf(t, parseManifests(t, manifest), "syncloop")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Spec: spec}
	if _, err := cs.CoreV1().Pods("syncloop-system").Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatalf("the chart's pod is rejected in a restricted namespace: %v", err)
	}
	loose := pod.DeepCopy()
	loose.Spec.Containers[0].SecurityContext = nil
	if _, err := cs.CoreV1().Pods("syncloop-system").Create(ctx, loose, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil {
		t.Fatal("Pod Security enforcement is not active: a pod without a securityContext was accepted")
	}

	// Run as the chart's ServiceAccount, with the installed rules; release
	// is the release's full name (its ServiceAccount, ConfigMap prefix and
	// Lease); extra has the mode (--leader-elect, --sharding).
	runAs := func(release, namespace string, extra ...string) (stop func()) {
		t.Helper()
		sa, err := env.ServiceAccountConfig(ctx, namespace, release)
		if err != nil {
			t.Fatal(err)
		}
		kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
		if err := testenv.WriteKubeconfig(kubeconfig, sa, release); err != nil {
			t.Fatal(err)
		}
		cm, err := cs.CoreV1().ConfigMaps(namespace).Get(ctx, release+"-rules", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		for name, text := range cm.Data {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for name, data := range cm.BinaryData { // the functions' modules
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		runCtx, cancel := context.WithCancel(context.Background())
		var logs syncBuffer
		exited := make(chan int, 1)
		go func() {
			exited <- runContext(runCtx, append([]string{"run", "-f", dir, "--kubeconfig", kubeconfig,
				"--leader-elect-namespace", namespace, "--leader-elect-id", release, "--rules-configmap", namespace + "/" + release + "-rules",
				"--metrics-bind-address", "0", "--health-probe-bind-address", "0"}, extra...), io.Discard, &logs)
		}()
		return func() {
			cancel()
			if code := <-exited; code != 0 {
				t.Errorf("syncloop as %s exited %d", release, code)
			}
			if strings.Contains(logs.String(), "forbidden") {
				t.Errorf("syncloop as %s was forbidden something:\n%s", release, grepLines(logs.String(), "forbidden"))
			}
		}
	}
	poll := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
	exists := func(get func() error) bool { return get() == nil }

	// As the chart's Deployment runs it: the release's installation.
	stop := runAs("syncloop", "syncloop-system", "--leader-elect", "--events=all", "--installation=syncloop")
	// The app example defines its kind: syncloop creates its CRD with the
	// chart's RBAC, and the App samples can be applied once it is served.
	crdClient, err := k8sdynamic.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	poll("the App CRD, created by syncloop and established", func() bool {
		crd, err := crdClient.Resource(crdGVR).Get(ctx, "apps.example.syncloop.dev", metav1.GetOptions{})
		if err != nil || crd.GetLabels()["syncloop.dev/rule"] != "app" {
			return false
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, c := range conds {
			if m, _ := c.(map[string]any); m["type"] == "Established" && m["status"] == "True" {
				return true
			}
		}
		return false
	})
	for _, ex := range examples {
		if err := applySamples(ctx, env, filepath.Join("../../examples", ex, "objects.yaml")); err != nil {
			t.Fatal(err)
		}
	}
	poll("children of every example, made with the chart's RBAC", func() bool {
		return exists(func() error {
			_, err := cs.NetworkingV1().NetworkPolicies("shop").Get(ctx, "same-namespace-only", metav1.GetOptions{})
			return err
		}) &&
			exists(func() error {
				_, err := cs.RbacV1().RoleBindings("shop").Get(ctx, "tenant-edit", metav1.GetOptions{})
				return err
			}) &&
			exists(func() error {
				_, err := cs.CoreV1().Secrets("sandbox").Get(ctx, "registry-pull", metav1.GetOptions{})
				return err
			}) &&
			exists(func() error {
				_, err := cs.AppsV1().Deployments("shop").Get(ctx, "web", metav1.GetOptions{})
				return err
			}) &&
			exists(func() error {
				_, err := cs.CoreV1().ConfigMaps("shop").Get(ctx, "namespace-metadata", metav1.GetOptions{})
				return err
			}) &&
			exists(func() error { // a function's children, its module from the ConfigMap's binaryData
				cm, err := cs.CoreV1().ConfigMaps("shop").Get(ctx, "catalogue-payments", metav1.GetOptions{})
				if err == nil && cm.Data["replicas"] != "5" {
					err = fmt.Errorf("data %v", cm.Data)
				}
				return err
			}) &&
			exists(func() error { // a lookup's source, read with the chart's RBAC
				_, err := cs.CoreV1().Secrets("releases").Get(ctx, "ci-registry", metav1.GetOptions{})
				return err
			}) &&
			exists(func() error { // a patch of an object syncloop does not own
				ns, err := cs.CoreV1().Namespaces().Get(ctx, "billing", metav1.GetOptions{})
				if err == nil && ns.Labels["company.com/runs-workloads"] != "true" {
					err = fmt.Errorf("labels %v", ns.Labels)
				}
				return err
			}) &&
			exists(func() error { // a list lookup
				np, err := cs.NetworkingV1().NetworkPolicies("ledger").Get(ctx, "team-peers", metav1.GetOptions{})
				if err == nil && np.Annotations["company.com/peers"] != "checkout, ledger" {
					err = fmt.Errorf("peers %q", np.Annotations["company.com/peers"])
				}
				return err
			}) &&
			exists(func() error { // a graph: the Service's address, read from the live Service
				svc, err := cs.CoreV1().Services("shop").Get(ctx, "web", metav1.GetOptions{})
				if err != nil {
					return err
				}
				cm, err := cs.CoreV1().ConfigMaps("shop").Get(ctx, "web-endpoint", metav1.GetOptions{})
				if err == nil && (svc.Spec.ClusterIP == "" || cm.Data["address"] != svc.Spec.ClusterIP) {
					err = fmt.Errorf("address %q, Service %q", cm.Data["address"], svc.Spec.ClusterIP)
				}
				return err
			}) &&
			exists(func() error { // a chain: the kubeconfig waited for the token controller's token
				token, err := cs.CoreV1().Secrets("builds").Get(ctx, "ci-robot-token", metav1.GetOptions{})
				if err != nil {
					return err
				}
				kc, err := cs.CoreV1().Secrets("builds").Get(ctx, "ci-robot-kubeconfig", metav1.GetOptions{})
				if err == nil && (len(token.Data["token"]) == 0 || !strings.Contains(string(kc.Data["config"]), "token: "+string(token.Data["token"])+"\n")) {
					err = fmt.Errorf("kubeconfig %q lacks the token", kc.Data["config"])
				}
				return err
			})
	})
	dc, err := k8sdynamic.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	// No kubelet runs pods here: the App's Deployment never becomes
	// available, and its Ready condition says so.
	poll("the App's Ready condition waiting for its Deployment", func() bool {
		app, err := dc.Resource(schema.GroupVersionResource{Group: "example.syncloop.dev", Version: "v1", Resource: "apps"}).
			Namespace("shop").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false
		}
		conds, _, _ := unstructured.NestedSlice(app.Object, "status", "conditions")
		for _, c := range conds {
			if m, _ := c.(map[string]any); m["type"] == "Ready" {
				return m["status"] == "False" && m["reason"] == "WaitingForDeployment"
			}
		}
		return false
	})
	revs, err := cs.AppsV1().ControllerRevisions("syncloop-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=syncloop,syncloop.dev/rule"})
	if err != nil || len(revs.Items) < len(examples) {
		t.Errorf("the rules' revisions, written with the chart's RBAC: %d, %v", len(revs.Items), err)
	}
	lease, err := cs.CoordinationV1().Leases("syncloop-system").Get(ctx, "syncloop", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		t.Errorf("no leader Lease held with the chart's RBAC: %v", err)
	}
	poll("an Event written with the chart's RBAC", func() bool {
		evs, _ := cs.CoreV1().Events("shop").List(ctx, metav1.ListOptions{})
		for _, e := range evs.Items {
			if e.Reason == "Applied" && e.Source.Component == "syncloop" {
				return true
			}
		}
		return false
	})
	stop()

	// The app rule orders its teardown (its endpoint reads its Service):
	// the App is held by its finalizer, which the uninstall hook takes off
	// once syncloop is gone, with the hook's own rights.
	heldApp := func() *unstructured.Unstructured {
		a, err := dc.Resource(schema.GroupVersionResource{Group: "example.syncloop.dev", Version: "v1", Resource: "apps"}).
			Namespace("shop").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	if f := heldApp().GetFinalizers(); !slices.Contains(f, "syncloop.teardown.syncloop.dev/app") {
		t.Errorf("the App's finalizers %v lack the app rule's teardown finalizer", f)
	}
	if out := runUninstallHook(t, env, "syncloop", "syncloop-system"); !strings.Contains(out, "from apps.example.syncloop.dev shop/web") {
		t.Errorf("the uninstall hook did not release the App:\n%s", out)
	}
	if f := heldApp().GetFinalizers(); len(f) > 0 {
		t.Errorf("the App holds %v after the uninstall hook", f)
	}

	// restricted: exactly what the tenant example needs.
	newNS("syncloop-restricted")
	restricted := []string{"install", "tenant", chartDir, "-n", "syncloop-restricted", "--kubeconfig", env.Kubeconfig(),
		"--set-file", "rules.tenant\\.yaml=../../examples/tenant-defaults/rules.yaml", "--set", "rbac.mode=restricted", "-f", "testdata/tenant-rbac.yaml"}
	if out, err := helmCmd(t, restricted...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	stop = runAs("tenant-syncloop", "syncloop-restricted", "--leader-elect")
	// What saying a load error on the rules ConfigMap, and keeping the
	// rules' revisions and rollouts, take: granted in the release's
	// namespace even in restricted mode.
	for _, attr := range []authorizationv1.ResourceAttributes{
		{Namespace: "syncloop-restricted", Verb: "get", Resource: "configmaps", Name: "tenant-syncloop-rules"},
		{Namespace: "syncloop-restricted", Verb: "create", Resource: "events"},
		{Namespace: "syncloop-restricted", Verb: "create", Group: "apps", Resource: "controllerrevisions"},
		// A rollout's record is an annotation of its revision.
		{Namespace: "syncloop-restricted", Verb: "patch", Group: "apps", Resource: "controllerrevisions"},
		// A broken file follows the revisions other replicas record.
		{Namespace: "syncloop-restricted", Verb: "watch", Group: "apps", Resource: "controllerrevisions"},
	} {
		review, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: "system:serviceaccount:syncloop-restricted:tenant-syncloop", ResourceAttributes: &attr}}, metav1.CreateOptions{})
		if err != nil || !review.Status.Allowed {
			t.Errorf("restricted release may not %s %s %s: %v %+v", attr.Verb, attr.Resource, attr.Name, err, review.Status)
		}
	}
	team := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "restricted-team", Labels: map[string]string{"tenant": "r", "tier": "gold"}}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, team, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("the tenant defaults, made with restricted RBAC", func() bool {
		return exists(func() error {
			_, err := cs.CoreV1().ResourceQuotas("restricted-team").Get(ctx, "tenant-quota", metav1.GetOptions{})
			return err
		}) &&
			exists(func() error {
				_, err := cs.RbacV1().RoleBindings("restricted-team").Get(ctx, "tenant-edit", metav1.GetOptions{})
				return err
			})
	})
	// The settings, made once: the Namespace remembers them (a patch the
	// trigger's rules grant).
	poll("the settings made once, and remembered on the Namespace", func() bool {
		ns, err := cs.CoreV1().Namespaces().Get(ctx, "restricted-team", metav1.GetOptions{})
		return err == nil && ns.Annotations[rules.CreatedOnceKey("tenant-defaults")] == "settings/ConfigMap./restricted-team/tenant-settings"
	})
	stop()

	// identity.defaultServiceAccount: the rules act as the chart's "rules"
	// ServiceAccount, which holds rbac.rules; syncloop's own account may
	// write no kind the rules make — nothing but its Events, Leases and
	// revisions — and may impersonate that one ServiceAccount only.
	newNS("syncloop-identity")
	identity := []string{"install", "imp", chartDir, "-n", "syncloop-identity", "--kubeconfig", env.Kubeconfig(),
		"--set-file", "rules.tenant\\.yaml=../../examples/tenant-defaults/rules.yaml", "--set", "rbac.mode=restricted", "-f", "testdata/tenant-rbac.yaml",
		"--set", "identity.defaultServiceAccount=rules", "--set", "tenantRules.enabled=true"}
	if out, err := helmCmd(t, identity...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	may := func(user string, attr authorizationv1.ResourceAttributes) bool {
		t.Helper()
		review, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, ResourceAttributes: &attr}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return review.Status.Allowed
	}
	own, rulesSA := "system:serviceaccount:syncloop-identity:imp-syncloop", "system:serviceaccount:syncloop-identity:rules"
	for _, res := range []struct{ group, resource string }{
		{"", "namespaces"}, {"", "configmaps"}, {"", "secrets"}, {"", "resourcequotas"}, {"", "serviceaccounts"}, {"", "pods"},
		{"networking.k8s.io", "networkpolicies"}, {"rbac.authorization.k8s.io", "rolebindings"}, {"rbac.authorization.k8s.io", "clusterrolebindings"},
		{"apps", "deployments"}, {"apiextensions.k8s.io", "customresourcedefinitions"}, {"example.syncloop.dev", "apps"},
	} {
		for _, verb := range []string{"create", "update", "patch", "delete"} {
			for _, ns := range []string{"", "syncloop-identity", "identity-team"} {
				if may(own, authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: res.group, Resource: res.resource}) {
					t.Errorf("syncloop's own account may %s %s.%s in %q: the rules' rights are the rules ServiceAccount's", verb, res.resource, res.group, ns)
				}
			}
		}
	}
	for _, c := range []struct {
		attr authorizationv1.ResourceAttributes
		want bool
	}{
		{authorizationv1.ResourceAttributes{Namespace: "syncloop-identity", Verb: "impersonate", Resource: "serviceaccounts", Name: "rules"}, true},
		{authorizationv1.ResourceAttributes{Namespace: "syncloop-identity", Verb: "impersonate", Resource: "serviceaccounts", Name: "other"}, false},
		{authorizationv1.ResourceAttributes{Namespace: "kube-system", Verb: "impersonate", Resource: "serviceaccounts", Name: "rules"}, false},
		{authorizationv1.ResourceAttributes{Verb: "impersonate", Resource: "users", Name: "admin"}, false},
		{authorizationv1.ResourceAttributes{Verb: "impersonate", Resource: "groups", Name: "system:masters"}, false},
		{authorizationv1.ResourceAttributes{Verb: "bind", Group: "rbac.authorization.k8s.io", Resource: "clusterroles", Name: "edit"}, false},
		{authorizationv1.ResourceAttributes{Namespace: "identity-team", Verb: "create", Resource: "events"}, true},
		// Tenant rules: the teams' ConfigMaps read, their default
		// ServiceAccounts impersonated, no other.
		{authorizationv1.ResourceAttributes{Namespace: "tenant-team", Verb: "list", Resource: "configmaps"}, true},
		{authorizationv1.ResourceAttributes{Namespace: "tenant-team", Verb: "impersonate", Resource: "serviceaccounts", Name: "default"}, true},
		{authorizationv1.ResourceAttributes{Namespace: "tenant-team", Verb: "impersonate", Resource: "serviceaccounts", Name: "admin"}, false},
	} {
		if got := may(own, c.attr); got != c.want {
			t.Errorf("syncloop's own account may %s %s %s in %q: %v, want %v", c.attr.Verb, c.attr.Resource, c.attr.Name, c.attr.Namespace, got, c.want)
		}
	}
	if !may(rulesSA, authorizationv1.ResourceAttributes{Namespace: "identity-team", Verb: "create", Resource: "resourcequotas"}) {
		t.Error("the rules ServiceAccount lacks rbac.rules")
	}
	// A team's rules in its namespace, whose default ServiceAccount may
	// manage ConfigMaps there and nothing else.
	newNS("tenant-team")
	grantConfigMaps(t, cs, "tenant-team", "default")
	for _, obj := range []*corev1.ConfigMap{
		{ObjectMeta: metav1.ObjectMeta{Name: "team-rules", Labels: map[string]string{"syncloop.dev/rules": "true"}}, Data: map[string]string{"app.yaml": tenantRule}},
		{ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"app": "web"}}},
	} {
		if _, err := cs.CoreV1().ConfigMaps("tenant-team").Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cs.CoreV1().Secrets("tenant-team").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stop = runAs("imp-syncloop", "syncloop-identity", "--leader-elect", "--default-service-account", "syncloop-identity/rules", "--tenant-rules")
	idTeam := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "identity-team", Labels: map[string]string{"tenant": "i", "tier": "gold"}}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, idTeam, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("the tenant defaults, made as the rules ServiceAccount", func() bool {
		quota, err := cs.CoreV1().ResourceQuotas("identity-team").Get(ctx, "tenant-quota", metav1.GetOptions{})
		if err != nil {
			return false
		}
		_, err = cs.RbacV1().RoleBindings("identity-team").Get(ctx, "tenant-edit", metav1.GetOptions{})
		return err == nil && quota.Labels[rules.LabelRule] != ""
	})
	poll("the team's tenant rule, run through the chart's RBAC", func() bool {
		cm, err := cs.CoreV1().ConfigMaps("tenant-team").Get(ctx, "web-settings", metav1.GetOptions{})
		return err == nil && cm.Labels[rules.LabelRule] == "tenant-team.app"
	})
	stop()

	// Sharded: two replicas share the tenant example's triggers, with the
	// Leases the chart lets them hold, watch and remove.
	newNS("syncloop-sharded")
	sharded := []string{"install", "sharded", chartDir, "-n", "syncloop-sharded", "--kubeconfig", env.Kubeconfig(),
		"--set-file", "rules.tenant\\.yaml=../../examples/tenant-defaults/rules.yaml", "--set", "sharding.enabled=true,replicaCount=2"}
	if out, err := helmCmd(t, sharded...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	stopA := runAs("sharded-syncloop", "syncloop-sharded", "--sharding", "--leader-elect-identity", "pod-a")
	stopB := runAs("sharded-syncloop", "syncloop-sharded", "--sharding", "--leader-elect-identity", "pod-b")
	for i := range 6 {
		team := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("sharded-team-%d", i), Labels: map[string]string{"tenant": "s", "tier": "gold"}}}
		if _, err := cs.CoreV1().Namespaces().Create(ctx, team, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	poll("the tenant defaults, made by two sharded replicas", func() bool {
		for i := range 6 {
			if !exists(func() error {
				_, err := cs.CoreV1().ResourceQuotas(fmt.Sprintf("sharded-team-%d", i)).Get(ctx, "tenant-quota", metav1.GetOptions{})
				return err
			}) {
				return false
			}
		}
		return true
	})
	// The triggers may all be done before the second replica has joined
	// (the first works alone meanwhile): each Lease comes to show both
	// members, polled.
	var views string
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		views = ""
		for _, member := range []string{"pod-a", "pod-b"} {
			l, err := cs.CoordinationV1().Leases("syncloop-sharded").Get(ctx, "sharded-syncloop-shard-"+member, metav1.GetOptions{})
			views += fmt.Sprintf(" %s: %v %v;", member, err, l.GetAnnotations())
			if err != nil || l.Annotations["syncloop.dev/shard-view"] != "pod-a,pod-b" {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Errorf("the shard Leases never both showed both members:%s", views)
	}
	stopA()
	stopB()
	if leases, err := cs.CoordinationV1().Leases("syncloop-sharded").List(ctx, metav1.ListOptions{}); err != nil || len(leases.Items) != 0 {
		t.Errorf("shard Leases left after the replicas stopped: %v %v", leases, err)
	}

	// One namespace: a Role there is all the chart grants, and all the app
	// example needs once its CRD is installed (here it is, from the first
	// release): a Role cannot grant CRDs, so manageCRDs is off and syncloop
	// only checks the CRD — as far as it may read it.
	newNS("apps-team")
	namespaced := []string{"install", "apps", chartDir, "-n", "apps-team", "--kubeconfig", env.Kubeconfig(),
		"--set-file", "rules.app\\.yaml=../../examples/app/rules.yaml", "--set", "watchNamespace=apps-team", "--set", "manageCRDs=false"}
	if out, err := helmCmd(t, namespaced...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	bindings, err := cs.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=apps"})
	if err != nil || len(bindings.Items) != 0 {
		t.Fatalf("the namespaced release bound cluster-wide rights: %v %v", bindings, err)
	}
	stop = runAs("apps-syncloop", "apps-team", "--leader-elect", "--watch-namespace", "apps-team", "--manage-crds=false")
	app := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.syncloop.dev/v1", "kind": "App",
		"metadata": map[string]any{"name": "api", "namespace": "apps-team"},
		"spec":     map[string]any{"image": "nginx:1.29", "replicas": int64(2)},
	}}
	dc, err = k8sdynamic.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	apps := dc.Resource(schema.GroupVersionResource{Group: "example.syncloop.dev", Version: "v1", Resource: "apps"}).Namespace("apps-team")
	if _, err := apps.Create(ctx, app, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("the app's children, made with a Role in one namespace", func() bool {
		return exists(func() error {
			_, err := cs.AppsV1().Deployments("apps-team").Get(ctx, "api", metav1.GetOptions{})
			return err
		}) && exists(func() error {
			_, err := cs.CoreV1().Services("apps-team").Get(ctx, "api", metav1.GetOptions{})
			return err
		}) && exists(func() error {
			a, err := apps.Get(ctx, "api", metav1.GetOptions{})
			if err == nil {
				if _, ok, _ := unstructured.NestedString(a.Object, "status", "url"); !ok {
					return errors.New("no status yet")
				}
			}
			return err
		})
	})
	stop()
}

// applySamples server-side applies an example's sample objects as the
// admin, creating their namespaces; one field manager per file, so that two
// examples' labels on one namespace merge.
func applySamples(ctx context.Context, env *testenv.Env, path string) error {
	objs, err := rules.ReadObjects(path)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		return err
	}
	dc, err := k8sdynamic.NewForConfig(env.Config())
	if err != nil {
		return err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(env.Config())
	if err != nil {
		return err
	}
	mapper := dynamic.NewMapper(disco, 0)
	for _, u := range objs {
		u.SetUID("")
		if ns := u.GetNamespace(); ns != "" {
			_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
		}
		m, err := mapper.Mapping(ctx, u.GroupVersionKind())
		if err != nil {
			return err
		}
		w := &dynamic.Writer{Client: &dynamic.Client{Dynamic: dc}}
		if _, err := w.Apply(ctx, m, u, "samples-"+filepath.Base(filepath.Dir(path)), true); err != nil {
			return fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	return nil
}

// TestChartHelm4: the chart lints, renders, rejects typos and installs with
// Helm 4 as with Helm 3.
func TestChartHelm4(t *testing.T) {
	helm4 := func(args ...string) (string, error) { return runHelm(t, testenv.Helm4, args...) }
	out, err := helm4("version")
	if err != nil || !strings.Contains(out, "v4.") {
		t.Fatalf("helm 4 version: %v %s", err, out)
	}
	if out, err := helm4("lint", "--strict", chartDir); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	out, err = helm4("template", "rel", chartDir, "-n", "syncloop-system", "--set-file", "rules.tenant\\.yaml=../../examples/tenant-defaults/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := parseManifests(t, out)
	if args := strings.Join(podSpec(t, r).Containers[0].Args, " "); !strings.Contains(args, "--leader-elect") {
		t.Errorf("helm 4 rendered args %q", args)
	}
	r.get(t, "ConfigMap", "rel-syncloop-rules")
	if _, err := helm4("template", "rel", chartDir, "--set", "replicaCont=3"); err == nil {
		t.Error("helm 4 accepted a typo in values")
	}

	env := testenv.Get(t)
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "syncloop-helm4", Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if out, err := helm4("install", "h4", chartDir, "-n", "syncloop-helm4", "--kubeconfig", env.Kubeconfig(),
		"--set-file", "rules.tenant\\.yaml=../../examples/tenant-defaults/rules.yaml"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := cs.AppsV1().Deployments("syncloop-helm4").Get(t.Context(), "h4-syncloop", metav1.GetOptions{}); err != nil {
		t.Errorf("helm 4 install: %v", err)
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestChartInstallationUpgrade: a release installed with this chart names
// its installation after itself; an upgrade of a release installed before
// installations had names (its Deployment passes no --installation) keeps
// it the default installation, so that its children stay its own.
func TestChartInstallationUpgrade(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, cs, "inst")
	helm := func(args ...string) {
		t.Helper()
		if out, err := helmCmd(t, append(args, "-n", ns, "--kubeconfig", env.Kubeconfig())...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	args := func() string {
		t.Helper()
		d, err := cs.AppsV1().Deployments(ns).Get(ctx, "legacy-syncloop", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(d.Spec.Template.Spec.Containers[0].Args, " ")
	}
	helm("install", "legacy", chartDir)
	if a := args(); !strings.Contains(a, "--installation=legacy") {
		t.Fatalf("installed: args %q lack --installation=legacy", a)
	}
	// As a release of a chart before installations had names was.
	d, err := cs.AppsV1().Deployments(ns).Get(ctx, "legacy-syncloop", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := &d.Spec.Template.Spec.Containers[0]
	c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--installation") })
	if _, err := cs.AppsV1().Deployments(ns).Update(ctx, d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	helm("upgrade", "legacy", chartDir)
	if a := args(); strings.Contains(a, "--installation") {
		t.Errorf("upgraded from before installation names: args %q name one; want the default installation", a)
	}
	helm("upgrade", "legacy", chartDir, "--set", "installation=platform")
	if a := args(); !strings.Contains(a, "--installation=platform") {
		t.Errorf("args %q lack the installation set", a)
	}
	// No kubelet runs the post-delete Job here: TestChartInstall runs it.
	helm("uninstall", "legacy", "--no-hooks")
}
