package schema

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/cel/openapi/resolver"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// Fetch returns the OpenAPI v3 document an API server serves for one
// group-version (/openapi/v3/apis/<group>/<version>, /openapi/v3/api/v1),
// or nil when it serves none, and a tag that changes with the document
// ("" when none is served).
type Fetch func(gv schema.GroupVersion) (doc []byte, tag string, err error)

// Versioner is a Source whose schemas may change while syncloop runs: the
// version of a kind's schema is part of the identity of the rules that use
// it, so that a rule is compiled again when its kinds change.
type Versioner interface {
	// Version identifies the schema Schema(gvk) returns now; "" for a
	// schema that never changes (or none).
	Version(gvk schema.GroupVersionKind) string
}

// Served is a Source over the schemas an API server serves, for the kinds
// next does not know: custom resources and aggregated APIs. next is asked
// first — the built-in kinds are compiled in and need no request. Each
// group-version's document is fetched once, when a rule first reads one of
// its kinds, and again after Forget; one that cannot be fetched counts as
// not served until then. Safe for concurrent use.
type Served struct {
	fetch Fetch
	next  Source

	mu   sync.Mutex
	docs map[schema.GroupVersion]*servedDoc
}

type servedDoc struct {
	tag      string
	version  string
	schemas  map[string]*spec.Schema // components by name
	kinds    map[string]string       // kind → component
	resolved map[string]*spec.Schema // kind → whole schema, refs resolved
}

// NewServed returns a Served that fetches with fetch and asks next first.
func NewServed(fetch Fetch, next Source) *Served {
	return &Served{fetch: fetch, next: next, docs: map[schema.GroupVersion]*servedDoc{}}
}

// Schema implements Source.
func (s *Served) Schema(gvk schema.GroupVersionKind) *spec.Schema {
	if s.next != nil {
		if sch := s.next.Schema(gvk); sch != nil {
			return sch
		}
	}
	d := s.doc(gvk.GroupVersion())
	if d == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sch, ok := d.resolved[gvk.Kind]; ok {
		return sch
	}
	name, ok := d.kinds[gvk.Kind]
	if !ok {
		return nil
	}
	const prefix = "#/components/schemas/"
	sch, err := resolver.PopulateRefs(func(ref string) (*spec.Schema, bool) {
		c, ok := d.schemas[ref[min(len(prefix), len(ref)):]]
		return c, ok
	}, prefix+name)
	if err != nil {
		sch = nil
	}
	d.resolved[gvk.Kind] = sch
	return sch
}

// Version implements Versioner: a digest of the group-version's document
// for served kinds, "" for the kinds next knows.
func (s *Served) Version(gvk schema.GroupVersionKind) string {
	if s.next != nil && s.next.Schema(gvk) != nil {
		return ""
	}
	if d := s.doc(gvk.GroupVersion()); d != nil {
		return d.version
	}
	return ""
}

// Forget drops what was fetched of group's group-versions: the next rule
// that reads one of their kinds fetches it again (its CRD changed).
func (s *Served) Forget(group string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for gv := range s.docs {
		if gv.Group == group {
			delete(s.docs, gv)
		}
	}
}

// doc returns gv's document, fetching it on first use; nil when the server
// serves none or it does not decode (its kinds are then not checked).
func (s *Served) doc(gv schema.GroupVersion) *servedDoc {
	s.mu.Lock()
	d, ok := s.docs[gv]
	s.mu.Unlock()
	if ok {
		if d.schemas == nil {
			return nil
		}
		return d
	}
	// A failure is remembered as "none served", as an absent document is:
	// asking again for every rule would hold the load up for as long as
	// the API server does not answer. The next Forget asks again.
	data, tag, err := s.fetch(gv)
	d = &servedDoc{tag: tag}
	if err == nil && data != nil {
		d = parseServed(data, tag)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.docs[gv] = d
	if d.schemas == nil {
		return nil
	}
	return d
}

// Stale reports whether the documents the server serves for group now
// (their tags, as Fetch gives them) differ from those the schemas were read
// from — changed, gone, or there when they were not: what was read of group
// is out of date. The API server publishes a CRD's schema a moment after
// the CRD changes.
func (s *Served) Stale(group string, now map[schema.GroupVersion]string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for gv, d := range s.docs {
		if gv.Group == group && d.tag != now[gv] {
			return true
		}
	}
	return false
}

// Fetched reports whether a rule read a kind of group, so that a
// document of it was fetched (or found not served).
func (s *Served) Fetched(group string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for gv := range s.docs {
		if gv.Group == group {
			return true
		}
	}
	return false
}

// Missing reports whether a rule read a kind of group whose group-version
// the server served no document for.
func (s *Served) Missing(group string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for gv, d := range s.docs {
		if gv.Group == group && d.schemas == nil {
			return true
		}
	}
	return false
}

func parseServed(data []byte, tag string) *servedDoc {
	var doc struct {
		Components struct {
			Schemas map[string]*spec.Schema `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return &servedDoc{tag: tag}
	}
	sum := sha256.Sum256(data)
	d := &servedDoc{tag: tag, version: hex.EncodeToString(sum[:8]), schemas: doc.Components.Schemas,
		kinds: map[string]string{}, resolved: map[string]*spec.Schema{}}
	for name, sch := range d.schemas {
		gvks, _ := sch.Extensions["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			if m, ok := g.(map[string]any); ok {
				if kind, ok := m["kind"].(string); ok {
					d.kinds[kind] = name
				}
			}
		}
	}
	return d
}
