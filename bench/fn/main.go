// Command fn is the benchmark's function step (built for WebAssembly by
// the function phase): the child the benchmark's template makes — a
// ConfigMap <trigger>-child with the trigger's name and value — computed
// in Go, once per call or, served, call after call.
package main

import (
	"encoding/json"

	"github.com/syncloop/syncloop/rules/function/guest"
)

type input struct {
	Object struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Data map[string]string `json:"data"`
	} `json:"object"`
}

func main() {
	guest.Run(func(data []byte) (any, error) {
		var in input
		if err := json.Unmarshal(data, &in); err != nil {
			return nil, err
		}
		name := in.Object.Metadata.Name
		return map[string]any{"children": []any{map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name + "-child"},
			"data":     map[string]any{"from": name, "value": in.Object.Data["value"]},
		}}}, nil
	})
}
