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
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"strings"
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
	// Served (the rule's serve: true), it stays up and answers one
	// request per line until stdin ends; otherwise it answers one call.
	if os.Getenv("SYNCLOOP_FUNCTION_MODE") != "serve" {
		answer(os.Stdin)
		return
	}
	lines := bufio.NewReader(os.Stdin)
	for {
		line, err := lines.ReadBytes('\n')
		if err != nil {
			return
		}
		answer(bytes.NewReader(line))
	}
}

// answer reads one request and writes its children as one line.
func answer(r io.Reader) {
	var in input
	if err := json.NewDecoder(r).Decode(&in); err != nil {
		fail("reading the input: %v", err)
	}
	replicas := map[string]string{"gold": "3", "silver": "2", "bronze": "1"}
	if in.Lookups.Tiers != nil { // the tiers ConfigMap overrides the defaults
		for tier, n := range in.Lookups.Tiers.Data {
			replicas[tier] = n
		}
	}
	var children []map[string]any
	sc := bufio.NewScanner(strings.NewReader(in.Object.Data["services"]))
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			fail("services line %d: want a name and a tier, got %q", line, sc.Text())
		}
		name, tier := fields[0], fields[1]
		n, ok := replicas[tier]
		if !ok {
			fail("services line %d: service %s: no tier %q", line, name, tier)
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
	if err := json.NewEncoder(os.Stdout).Encode(map[string]any{"children": children}); err != nil {
		fail("writing the output: %v", err)
	}
}

// fail says why on stderr and exits non-zero: the trigger fails with the
// first line of it (served, the instance ends; the next call starts
// another).
func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}
