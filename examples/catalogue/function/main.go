// Command function is the catalogue example's function step, built for
// WebAssembly (GOOS=wasip1 GOARCH=wasm; `make functions`, and the test
// suite, build it into ../catalogue.wasm). It reads the input syncloop
// writes on stdin — the trigger, the lookups, the variables — and writes
// the children on stdout: one ConfigMap per service the catalogue lists,
// with the replicas its tier gives and a shard computed from its name.
//
// What it does that a template cannot: it parses a text format (a
// whitespace table with comments) and derives a value by an algorithm
// (FNV-1a) that CEL has no function for.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/syncloop/syncloop/rules/function/guest"
)

// input is what syncloop gives a function (render.FunctionInput).
type input struct {
	Object struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Data map[string]string `json:"data"`
	} `json:"object"`
	Lookups struct {
		Tiers *struct {
			Data map[string]string `json:"data"`
		} `json:"tiers"`
	} `json:"lookups"`
}

// shards is how many shards the services spread over.
const shards = 8

func main() {
	// guest.Run answers one call, or, served (the rule's serve: true),
	// one request per line until stdin ends.
	guest.Run(catalogue)
}

// catalogue computes the children of one catalogue.
func catalogue(data []byte) (any, error) {
	var in input
	if err := json.Unmarshal(data, &in); err != nil {
		return nil, fmt.Errorf("reading the input: %v", err)
	}
	replicas := map[string]string{"gold": "3", "silver": "2", "bronze": "1"}
	if in.Lookups.Tiers != nil { // the tiers ConfigMap overrides the defaults
		for tier, n := range in.Lookups.Tiers.Data {
			replicas[tier] = n
		}
	}
	children := []map[string]any{}
	sc := bufio.NewScanner(strings.NewReader(in.Object.Data["services"]))
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("services line %d: want a name and a tier, got %q", line, sc.Text())
		}
		name, tier := fields[0], fields[1]
		n, ok := replicas[tier]
		if !ok {
			return nil, fmt.Errorf("services line %d: service %s: no tier %q", line, name, tier)
		}
		h := fnv.New32a()
		h.Write([]byte(name))
		children = append(children, map[string]any{
			"apiVersion": "v1",
			"kind":       "ConfigMap",
			"metadata": map[string]any{
				"name":   in.Object.Metadata.Name + "-" + name,
				"labels": map[string]any{"example.syncloop.dev/service": name},
			},
			"data": map[string]any{
				"tier":     tier,
				"replicas": n,
				"shard":    fmt.Sprint(h.Sum32() % shards),
			},
		})
	}
	return map[string]any{"children": children}, nil
}
