// Command openapi-snapshot writes the OpenAPI v3 schemas of the built-in
// Kubernetes kinds, as the local control plane's kube-apiserver (v1.37.2,
// built from the published modules) serves them, to the compressed file
// rules/schema reads: `go run ./hack/openapi-snapshot -o rules/schema/builtin.json.gz`.
//
// Descriptions are dropped (they are most of the size and no check reads
// them); every group-version's components are kept whole, so references
// resolve as they do on a server. hack/testenv.sh must have built the
// binaries.
package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"k8s.io/client-go/discovery"

	"github.com/syncloop/syncloop/internal/testenv"
)

// Snapshot is the file's format: the Kubernetes version; per
// group-version path ("api/v1", "apis/apps/v1"), the OpenAPI document's
// components.schemas; and where each kind's schema is
// ("apps/v1/Deployment" → path and component), so that a reader decodes
// only the components it needs.
type Snapshot struct {
	KubernetesVersion string                                `json:"kubernetesVersion"`
	GroupVersions     map[string]map[string]json.RawMessage `json:"groupVersions"`
	Kinds             map[string][2]string                  `json:"kinds"`
}

func main() {
	out := flag.String("o", "rules/schema/builtin.json.gz", "the file to write")
	flag.Parse()
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "openapi-snapshot:", err)
		os.Exit(1)
	}
}

func run(out string) error {
	ctx := context.Background()
	env, err := testenv.Start(ctx, testenv.Options{})
	if err != nil {
		return err
	}
	defer env.Stop()
	disco, err := discovery.NewDiscoveryClientForConfig(env.Config())
	if err != nil {
		return err
	}
	paths, err := disco.OpenAPIV3().Paths()
	if err != nil {
		return err
	}
	snap := Snapshot{KubernetesVersion: testenv.KubeVersion, GroupVersions: map[string]map[string]json.RawMessage{}, Kinds: map[string][2]string{}}
	var names []string
	for p := range paths {
		if p == "api" || p == "apis" || strings.HasPrefix(p, "openid") || strings.HasPrefix(p, "version") || strings.HasPrefix(p, "logs") {
			continue
		}
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		data, err := paths[p].Schema("application/json")
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		var doc struct {
			Components struct {
				Schemas map[string]any `json:"schemas"`
			} `json:"components"`
		}
		if err := json.Unmarshal(data, &doc); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		schemas := map[string]json.RawMessage{}
		gv := strings.TrimPrefix(strings.TrimPrefix(p, "apis/"), "api/")
		for name, s := range doc.Components.Schemas {
			if m, ok := s.(map[string]any); ok {
				gvks, _ := m["x-kubernetes-group-version-kind"].([]any)
				for _, g := range gvks {
					gm, _ := g.(map[string]any)
					group, _ := gm["group"].(string)
					version, _ := gm["version"].(string)
					kind, _ := gm["kind"].(string)
					// A document also lists other group-versions' kinds
					// (DeleteOptions, WatchEvent): keep each kind's own.
					if own := strings.TrimPrefix(group+"/"+version, "/"); own == gv {
						snap.Kinds[own+"/"+kind] = [2]string{p, name}
					}
				}
			}
			raw, err := json.Marshal(stripDescriptions(s))
			if err != nil {
				return err
			}
			schemas[name] = raw
		}
		snap.GroupVersions[p] = schemas
	}
	data, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if _, err := zw.Write(data); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	fmt.Printf("%d group-versions, %d bytes of JSON, %d compressed\n", len(snap.GroupVersions), len(data), buf.Len())
	return os.WriteFile(out, buf.Bytes(), 0o644)
}

// stripDescriptions removes every "description" key of a schema.
func stripDescriptions(v any) any {
	switch v := v.(type) {
	case map[string]any:
		delete(v, "description")
		for k, e := range v {
			if k == "properties" {
				// property names are data: a property called description stays
				if props, ok := e.(map[string]any); ok {
					for pk, pv := range props {
						props[pk] = stripDescriptions(pv)
					}
					continue
				}
			}
			v[k] = stripDescriptions(e)
		}
	case []any:
		for i := range v {
			v[i] = stripDescriptions(v[i])
		}
	}
	return v
}
