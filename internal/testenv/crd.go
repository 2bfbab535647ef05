package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallCRDs creates (or updates, by server-side apply) every
// CustomResourceDefinition in the given YAML files and waits until each is
// Established and every one of its served versions is in discovery. Other
// documents in the files are ignored. It returns the CRDs' names.
func (e *Env) InstallCRDs(ctx context.Context, files ...string) ([]string, error) {
	dc, err := dynamic.NewForConfig(e.config)
	if err != nil {
		return nil, err
	}
	var crds []*unstructured.Unstructured
	for _, f := range files {
		docs, err := readYAMLDocuments(f)
		if err != nil {
			return nil, err
		}
		for _, d := range docs {
			if d.GetKind() == "CustomResourceDefinition" {
				crds = append(crds, d)
			}
		}
	}
	var names []string
	for _, crd := range crds {
		crd.SetAPIVersion("apiextensions.k8s.io/v1")
		_, err := dc.Resource(crdGVR).Apply(ctx, crd.GetName(), crd, metav1.ApplyOptions{FieldManager: "syncloop-testenv", Force: true})
		if err != nil {
			return nil, fmt.Errorf("installing CRD %s: %w", crd.GetName(), err)
		}
		names = append(names, crd.GetName())
	}
	for _, crd := range crds {
		if err := e.waitCRDServed(ctx, dc, crd); err != nil {
			return nil, err
		}
	}
	return names, nil
}

func (e *Env) waitCRDServed(ctx context.Context, dc dynamic.Interface, crd *unstructured.Unstructured) error {
	disco, err := discovery.NewDiscoveryClientForConfig(e.config)
	if err != nil {
		return err
	}
	group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		live, err := dc.Resource(crdGVR).Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if !crdEstablished(live) {
			return false, nil
		}
		for _, v := range versions {
			vm, _ := v.(map[string]any)
			if served, _ := vm["served"].(bool); !served {
				continue
			}
			name, _ := vm["name"].(string)
			list, err := disco.ServerResourcesForGroupVersion(group + "/" + name)
			if err != nil {
				return false, nil
			}
			found := false
			for _, r := range list.APIResources {
				found = found || r.Name == plural
			}
			if !found {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s not served: %w", crd.GetName(), err)
	}
	return nil
}

func crdEstablished(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		cm, _ := c.(map[string]any)
		if cm["type"] == "Established" && cm["status"] == "True" {
			return true
		}
	}
	return false
}

// readYAMLDocuments decodes every non-empty document of a YAML file.
func readYAMLDocuments(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if _, err := meta.Accessor(u); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, u)
	}
}
