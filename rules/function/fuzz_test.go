package function

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// FuzzBoundTables reads arbitrary bytes as a module's: never a panic;
// what it returns bounds every table it declares, and reads the same
// again (bounding is idempotent); and bytes it returns unread are only
// those it cannot read as a module.
func FuzzBoundTables(f *testing.F) {
	for _, wasm := range [][]byte{
		growModule(1, table(1, -1)), growModule(1, table(0, 1<<32-1), table(3, 7)), recurseModule(), spewModule(1),
		[]byte("\x00asm\x01\x00\x00\x00\x04\x04\x01\x70\x00\x05"), []byte("\x00asm\x01\x00\x00\x00\x04\xff\xff\xff\xff\x0f"),
		[]byte("not wasm"), nil,
	} {
		f.Add(wasm)
	}
	f.Fuzz(func(t *testing.T, wasm []byte) {
		out, err := boundTables(wasm)
		if err != nil {
			return
		}
		again, err := boundTables(out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("bounded %x, then %x (%v): not the same", out, again, err)
		}
		for _, most := range tableMaxima(t, out) {
			if most > MaxTableElements {
				t.Fatalf("%x: a table may hold %d references", out, most)
			}
		}
	})
}

// tableMaxima are the maxima of the tables a module bounded declares;
// none for bytes that are not a module.
func tableMaxima(t *testing.T, wasm []byte) []uint64 {
	if len(wasm) < 8 || !bytes.Equal(wasm[:4], []byte("\x00asm")) {
		return nil
	}
	var out []uint64
	for i := 8; i < len(wasm); {
		size, n := binary.Uvarint(wasm[i+1:])
		start, end := i+1+n, i+1+n+int(size)
		if wasm[i] == tableSection {
			sec := wasm[start:end]
			count, p := binary.Uvarint(sec)
			for range count {
				if sec[p+1] != 0x01 {
					t.Fatalf("%x: a table without a maximum", wasm)
				}
				_, n := binary.Uvarint(sec[p+2:])
				most, m := binary.Uvarint(sec[p+2+n:])
				out = append(out, most)
				p += 2 + n + m
			}
		}
		i = end
	}
	return out
}

// FuzzReadLine reads a served module's answer from arbitrary output:
// never a panic, never more than the limit, the line up to the first
// newline when there is one within it.
func FuzzReadLine(f *testing.F) {
	f.Add([]byte("{\"children\": []}\nmore"), 64)
	f.Add(bytes.Repeat([]byte("x"), 70_000), 65_536)
	f.Add([]byte("\n"), 0)
	f.Fuzz(func(t *testing.T, out []byte, limit int) {
		if limit < 0 || limit > 1<<20 {
			return
		}
		line, err := readLine(bufio.NewReaderSize(bytes.NewReader(out), 16), limit)
		first, _, found := bytes.Cut(out, []byte("\n"))
		switch {
		case len(line) > limit:
			t.Fatalf("read %d bytes, more than the limit of %d", len(line), limit)
		case err == nil && (!found || !bytes.Equal(line, first)):
			t.Fatalf("read %q from %q, want its first line", line, out)
		case err != nil && found && len(first) <= limit && !errors.Is(err, bufio.ErrBufferFull):
			t.Fatalf("%q: %v, want its first line of %d bytes", out, err, len(first))
		}
	})
}
