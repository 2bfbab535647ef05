// Package guest is a function step's side of the protocol, for modules
// written in Go (GOOS=wasip1 GOARCH=wasm): Run reads each request, calls
// the handler and writes its answer, whether syncloop starts the module
// for one call or keeps it serving (serve: true). Only the standard
// library: it builds for WebAssembly as it does anywhere.
//
//	func main() {
//		guest.Run(func(input []byte) (any, error) {
//			var in struct{ Object map[string]any `json:"object"` }
//			if err := json.Unmarshal(input, &in); err != nil {
//				return nil, err
//			}
//			return map[string]any{"children": []any{ /* … */ }}, nil
//		})
//	}
package guest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// Run answers the requests on stdin with handle and returns when there
// are no more: one request (the whole of stdin), or, when syncloop serves
// the module (SYNCLOOP_FUNCTION_MODE=serve), one per line until stdin
// ends. handle's answer is written to stdout as one line of JSON; an
// error is written to stderr, and the module exits 1 — its first line is
// what the trigger's Failed Event says.
func Run(handle func(input []byte) (any, error)) {
	if err := serve(os.Stdin, os.Stdout, os.Getenv("SYNCLOOP_FUNCTION_MODE") == "serve", handle); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// serve is Run on in and out.
func serve(in io.Reader, out io.Writer, lines bool, handle func([]byte) (any, error)) error {
	enc := json.NewEncoder(out)
	answer := func(input []byte) error {
		v, err := handle(input)
		if err != nil {
			return err
		}
		return enc.Encode(v)
	}
	if !lines {
		input, err := io.ReadAll(in)
		if err != nil {
			return err
		}
		return answer(input)
	}
	r := bufio.NewReaderSize(in, 64<<10)
	for {
		line, err := r.ReadBytes('\n')
		if err == io.EOF && len(line) == 0 {
			return nil
		}
		if err != nil && err != io.EOF {
			return err
		}
		if err := answer(line); err != nil {
			return err
		}
	}
}
