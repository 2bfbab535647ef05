package rules

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// ReadObjects reads Kubernetes objects from YAML or JSON files (multi-
// document streams; kind List is unwrapped), in order. Every object needs
// apiVersion, kind and metadata.name.
func ReadObjects(paths ...string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, p := range paths {
		files, err := objectFiles(p)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			objs, err := readObjectFile(f)
			if err != nil {
				return nil, err
			}
			out = append(out, objs...)
		}
	}
	return out, nil
}

// objectFiles is FindFiles for objects: a file as named, a directory's
// *.yaml, *.yml and *.json files.
func objectFiles(p string) ([]string, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return []string{p}, nil
	}
	return FindFiles(p)
}

func readObjectFile(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []*unstructured.Unstructured
	for doc := 1; ; doc++ {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, doc, err)
		}
		js, err := yaml.YAMLToJSON(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, doc, err)
		}
		if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			continue
		}
		var m map[string]any
		if err := utiljson.Unmarshal(js, &m); err != nil {
			return nil, fmt.Errorf("%s: document %d: not an object: %w", path, doc, err)
		}
		obj := &unstructured.Unstructured{Object: m}
		if obj.IsList() {
			err := obj.EachListItem(func(o runtime.Object) error {
				item := o.(*unstructured.Unstructured)
				if err := checkObject(item); err != nil {
					return err
				}
				out = append(out, item)
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", path, doc, err)
			}
			continue
		}
		if err := checkObject(obj); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, doc, err)
		}
		out = append(out, obj)
	}
}

func checkObject(o *unstructured.Unstructured) error {
	if o.GetAPIVersion() == "" || o.GetKind() == "" || o.GetName() == "" {
		return fmt.Errorf("object needs apiVersion, kind and metadata.name (got %q %q %q)", o.GetAPIVersion(), o.GetKind(), o.GetName())
	}
	return nil
}

// ObjectRef names an object in render and plan output.
type ObjectRef struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace"`
	Name       string `json:"name"`
}

// RefOf returns obj's reference.
func RefOf(obj *unstructured.Unstructured) ObjectRef {
	return ObjectRef{APIVersion: obj.GetAPIVersion(), Kind: obj.GetKind(), Namespace: obj.GetNamespace(), Name: obj.GetName()}
}

// String is "<apiVersion> <Kind> <namespace/name>", without what is empty.
func (r ObjectRef) String() string {
	name := r.NamespacedName()
	if r.APIVersion == "" {
		return r.Kind + " " + name
	}
	return r.APIVersion + " " + r.Kind + " " + name
}
