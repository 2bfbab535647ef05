// Command fn is the function step of the engine's tests, built for
// WebAssembly by the test: what it does is its trigger's data.do.
package main

import (
	"encoding/json"
	"strings"

	"github.com/syncloop/syncloop/rules/function/guest"
)

// version is set at build time (-X main.version=…): a new module.
var version = "v1"

func main() { guest.Run(answer) }

func answer(input []byte) (any, error) {
	var in struct {
		Object struct {
			Metadata struct{ Name string } `json:"metadata"`
			Data     map[string]string     `json:"data"`
		} `json:"object"`
	}
	if err := json.Unmarshal(input, &in); err != nil {
		return nil, err
	}
	data := in.Object.Data
	switch data["do"] {
	case "loop":
		for {
		}
	case "alloc":
		var keep [][]byte
		for {
			keep = append(keep, make([]byte, 16<<20))
		}
	case "trap":
		var m map[string]int
		m["x"]++
	case "junk":
		return "not an object", nil
	case "generate":
		return json.RawMessage(`{"children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "x-"}}]}`), nil
	case "kind":
		return json.RawMessage(`{"children": [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "not-allowed"}}]}`), nil
	}
	var children []map[string]any
	for _, item := range strings.Split(data["items"], ",") {
		if item == "" {
			continue
		}
		children = append(children, map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": in.Object.Metadata.Name + "-" + item},
			"data":     map[string]any{"item": item, "version": version},
		})
	}
	return map[string]any{"children": children}, nil
}
