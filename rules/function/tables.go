package function

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// Tables. The runtime caps a module's linear memory, not its tables: a
// table declared without a maximum may grow to 2³² references of 8 bytes
// each, in one table.grow that runs in the host, where no deadline stops
// it (600 million took 17 s and 4.7 GB). So before wazero sees a module,
// Compile bounds its tables: a table declared without a maximum, or with
// one above MaxTableElements, is given MaxTableElements as its maximum —
// table.grow past it fails, returning -1, as the specification lets any
// grow fail — and a module that declares more than MaxTables tables, or a
// table holding more than MaxTableElements from the start, is refused.
// Go's compiler declares one table, without a maximum, and never grows it.
// A table a module imports cannot be had: the runtime's only host module,
// WASI's, exports none, so such a module does not instantiate.

// MaxTableElements is the most references a table may hold: 8 MiB.
const MaxTableElements = 1 << 20

// MaxTables is the most tables a module may declare.
const MaxTables = 4

const (
	tableSection = 4
	funcref      = 0x70
	externref    = 0x6f
)

// errUnreadable is a module whose sections boundTables cannot read.
var errUnreadable = errors.New("its sections cannot be read")

// boundTables returns wasm with the maxima of its tables bounded, as
// above, or why it cannot be. Bytes that are not a module are returned as
// they are, for the compiler to refuse; errUnreadable is a module whose
// sections do not read as the binary format lays them out. Every section
// is read, so that no table section hides behind another.
func boundTables(wasm []byte) ([]byte, error) {
	if len(wasm) < 8 || !bytes.Equal(wasm[:4], []byte("\x00asm")) {
		return wasm, nil
	}
	out, tables := append([]byte(nil), wasm[:8]...), false
	for i := 8; i < len(wasm); {
		id := wasm[i]
		size, n := binary.Uvarint(wasm[i+1:])
		start := i + 1 + n
		if n <= 0 || size > uint64(len(wasm)-start) {
			return nil, errUnreadable
		}
		end := start + int(size)
		if id != tableSection {
			out = append(out, wasm[i:end]...)
			i = end
			continue
		}
		body, err := boundTableSection(wasm[start:end])
		if err != nil {
			return nil, err
		}
		out = append(out, tableSection)
		out = binary.AppendUvarint(out, uint64(len(body)))
		out = append(out, body...)
		i, tables = end, true
	}
	if !tables {
		return wasm, nil
	}
	return out, nil
}

// boundTableSection is the table section sec with each table's maximum
// bounded.
func boundTableSection(sec []byte) ([]byte, error) {
	count, p := binary.Uvarint(sec)
	switch {
	case p <= 0:
		return nil, errUnreadable
	case count > MaxTables:
		return nil, fmt.Errorf("it declares %d tables, more than the %d a module may have", count, MaxTables)
	}
	out := binary.AppendUvarint(nil, count)
	for t := range int(count) {
		if p+2 > len(sec) {
			return nil, errUnreadable
		}
		ref, flags := sec[p], sec[p+1]
		p += 2
		if ref != funcref && ref != externref {
			return nil, fmt.Errorf("its table %d holds references of a type syncloop cannot bound (0x%02x)", t, ref)
		}
		least, n := binary.Uvarint(sec[p:])
		if n <= 0 {
			return nil, errUnreadable
		}
		p += n
		most := uint64(MaxTableElements)
		switch flags {
		case 0x00: // no maximum
		case 0x01:
			declared, n := binary.Uvarint(sec[p:])
			if n <= 0 {
				return nil, errUnreadable
			}
			p += n
			most = min(declared, most)
		default:
			return nil, fmt.Errorf("its table %d has limits syncloop cannot bound (flags 0x%02x)", t, flags)
		}
		if least > MaxTableElements {
			return nil, fmt.Errorf("its table %d holds %d references from the start, more than the %d a table may have", t, least, MaxTableElements)
		}
		out = append(out, ref, 0x01)
		out = binary.AppendUvarint(binary.AppendUvarint(out, least), most)
	}
	if p != len(sec) {
		return nil, errUnreadable
	}
	return out, nil
}
