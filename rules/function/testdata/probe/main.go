// Command probe is a WASI command for the function package's tests: what
// it does is the input's "do". Started with SYNCLOOP_FUNCTION_MODE=serve,
// it answers one request per line until stdin ends.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// calls counts the requests this instance answered: more than one only
// when it serves.
var calls int

func main() {
	if os.Getenv("SYNCLOOP_FUNCTION_MODE") != "serve" {
		data, _ := io.ReadAll(os.Stdin)
		handle(data)
		return
	}
	in := bufio.NewReader(os.Stdin)
	for {
		line, err := in.ReadBytes('\n')
		if err != nil {
			return
		}
		handle(line)
	}
}

func handle(data []byte) {
	calls++
	var in struct {
		Do   string `json:"do"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal(data, &in); err != nil {
		fmt.Fprintln(os.Stderr, "bad input:", err)
		os.Exit(2)
	}
	switch in.Do {
	case "echo":
		fmt.Fprintln(os.Stderr, "echoing", in.Name)
		json.NewEncoder(os.Stdout).Encode(map[string]any{"hello": in.Name, "at": time.Now().Unix(), "calls": calls})
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
