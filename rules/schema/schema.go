// Package schema knows the OpenAPI schemas of the kinds rules touch — the
// built-in kinds, compiled in; CustomResourceDefinitions given with the
// rules or objects — and checks templates against them: a field the kind
// does not have, or a value of the wrong type, is found when the rule loads,
// not when the API server drops or rejects it.
//
// It knows nothing of rules' YAML or of CEL: the caller walks its own
// documents and asks this package about paths and values.
package schema

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/cel/openapi/resolver"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// Source gives the schema of a kind: the whole object, references
// resolved. nil: the kind is not known (its templates are not checked).
type Source interface {
	Schema(gvk schema.GroupVersionKind) *spec.Schema
}

// builtinGz is the OpenAPI v3 of the built-in kinds as kube-apiserver
// v1.37.2 serves them, descriptions dropped (hack/openapi-snapshot writes
// it): 40 KB compressed, 0.6 MB when read.
//
//go:embed builtin.json.gz
var builtinGz []byte

// Builtin returns the schemas of the built-in kinds.
func Builtin() Source { return builtinSource }

var builtinSource = &builtin{}

type builtin struct {
	once sync.Once
	err  error
	snap struct {
		GroupVersions map[string]map[string]json.RawMessage `json:"groupVersions"`
		Kinds         map[string][2]string                  `json:"kinds"` // "apps/v1/Deployment" → path, component
	}
	mu      sync.Mutex
	decoded map[string]*spec.Schema // "path component" → decoded component
	done    map[schema.GroupVersionKind]*spec.Schema
}

func (b *builtin) load() {
	zr, err := gzip.NewReader(bytes.NewReader(builtinGz))
	if err != nil {
		b.err = err
		return
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		b.err = err
		return
	}
	// Components stay raw until a kind needs them.
	b.err = json.Unmarshal(data, &b.snap)
	b.decoded = map[string]*spec.Schema{}
	b.done = map[schema.GroupVersionKind]*spec.Schema{}
}

// Schema implements Source.
func (b *builtin) Schema(gvk schema.GroupVersionKind) *spec.Schema {
	b.once.Do(b.load)
	if b.err != nil {
		panic(fmt.Sprintf("the compiled-in schemas do not load: %v", b.err))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if s, ok := b.done[gvk]; ok {
		return s
	}
	where, ok := b.snap.Kinds[strings.TrimPrefix(gvk.GroupVersion().String()+"/"+gvk.Kind, "/")]
	if !ok {
		return nil
	}
	path := where[0]
	s, err := resolver.PopulateRefs(func(ref string) (*spec.Schema, bool) {
		return b.component(path, strings.TrimPrefix(ref, "#/components/schemas/"))
	}, "#/components/schemas/"+where[1])
	if err != nil {
		s = nil
	}
	b.done[gvk] = s
	return s
}

// component decodes one component of a group-version's document, once.
func (b *builtin) component(path, name string) (*spec.Schema, bool) {
	key := path + " " + name
	if s, ok := b.decoded[key]; ok {
		return s, true
	}
	raw, ok := b.snap.GroupVersions[path][name]
	if !ok {
		return nil, false
	}
	s := &spec.Schema{}
	if err := json.Unmarshal(raw, s); err != nil {
		return nil, false
	}
	b.decoded[key] = s
	return s, true
}

// Kinds is a Source from a table, and a Source to fall back on.
type Kinds struct {
	schemas  map[schema.GroupVersionKind]*spec.Schema
	versions map[schema.GroupVersionKind]string
	next     Source
}

// Version implements Versioner: a digest of a CRD's schema, or what next
// says of the kinds it does not define.
func (k *Kinds) Version(gvk schema.GroupVersionKind) string {
	if v, ok := k.versions[gvk]; ok {
		return v
	}
	if n, ok := k.next.(Versioner); ok {
		return n.Version(gvk)
	}
	return ""
}

// Schema implements Source.
func (k *Kinds) Schema(gvk schema.GroupVersionKind) *spec.Schema {
	if s, ok := k.schemas[gvk]; ok {
		return s
	}
	if k.next == nil {
		return nil
	}
	return k.next.Schema(gvk)
}
