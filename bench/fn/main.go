// Command fn is the benchmark's function step (built for WebAssembly by
// the function phase): the child the benchmark's template makes — a
// ConfigMap <trigger>-child with the trigger's name and value — computed
// in Go, once per call or, served, call after call.
package main

import (
	"bufio"
	"encoding/json"
	"os"
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
	out := json.NewEncoder(os.Stdout)
	if os.Getenv("SYNCLOOP_FUNCTION_MODE") != "serve" {
		var in input
		if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
			os.Exit(2)
		}
		_ = out.Encode(children(in))
		return
	}
	lines := bufio.NewReaderSize(os.Stdin, 64<<10)
	for {
		line, err := lines.ReadBytes('\n')
		if err != nil {
			return
		}
		var in input
		if err := json.Unmarshal(line, &in); err != nil {
			os.Exit(2)
		}
		_ = out.Encode(children(in))
	}
}

func children(in input) map[string]any {
	name := in.Object.Metadata.Name
	return map[string]any{"children": []any{map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": name + "-child"},
		"data":     map[string]any{"from": name, "value": in.Object.Data["value"]},
	}}}
}
