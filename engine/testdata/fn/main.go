// Command fn is the function step of the engine's tests, built for
// WebAssembly by the test: what it does is its trigger's data.do.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// version is set at build time (-X main.version=…): a new module.
var version = "v1"

func main() {
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

func answer(r io.Reader) {
	var in struct {
		Object struct {
			Metadata struct{ Name string } `json:"metadata"`
			Data     map[string]string     `json:"data"`
		} `json:"object"`
	}
	if err := json.NewDecoder(r).Decode(&in); err != nil {
		fmt.Fprintln(os.Stderr, "bad input:", err)
		os.Exit(2)
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
		fmt.Println("not json")
		return
	case "generate":
		fmt.Println(`{"children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "x-"}}]}`)
		return
	case "kind":
		fmt.Println(`{"children": [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "not-allowed"}}]}`)
		return
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
	json.NewEncoder(os.Stdout).Encode(map[string]any{"children": children})
}
