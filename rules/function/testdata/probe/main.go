// Command probe is a WASI command for the function package's tests: what
// it does is the input's "do".
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

func main() {
	var in struct {
		Do   string `json:"do"`
		Name string `json:"name"`
	}
	data, _ := io.ReadAll(os.Stdin)
	if err := json.Unmarshal(data, &in); err != nil {
		fmt.Fprintln(os.Stderr, "bad input:", err)
		os.Exit(2)
	}
	switch in.Do {
	case "echo":
		fmt.Fprintln(os.Stderr, "echoing", in.Name)
		json.NewEncoder(os.Stdout).Encode(map[string]any{"hello": in.Name, "at": time.Now().Unix()})
	case "loop":
		for {
		}
	case "alloc":
		var keep [][]byte
		for {
			keep = append(keep, make([]byte, 1<<20))
		}
	case "trap":
		var m map[string]int
		m["x"] = 1 // a nil map: panics
	case "exit":
		fmt.Fprintln(os.Stderr, "giving up: no such thing")
		os.Exit(3)
	case "spew":
		fmt.Print(strings.Repeat("x", 1<<20))
	}
}
