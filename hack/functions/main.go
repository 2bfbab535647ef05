// Command functions builds the examples' function steps for WebAssembly
// (internal/examplefn): `make functions`.
package main

import (
	"fmt"
	"os"

	"github.com/syncloop/syncloop/internal/examplefn"
)

func main() {
	if err := examplefn.Build("examples"); err != nil {
		fmt.Fprintln(os.Stderr, "functions:", err)
		os.Exit(1)
	}
}
