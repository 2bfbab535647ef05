package function

import "encoding/binary"

// A few hostile modules, assembled here from the binary format rather
// than built by a compiler: what they do is one instruction a compiler
// would not emit on purpose. Each exports _start, and memory when it has
// one.

// WebAssembly's section ids, instructions and types used below.
const (
	secType, secImport, secFunc, secTable, secMem, secExport, secCode, secData = 1, 2, 3, 4, 5, 7, 10, 11

	opUnreachable, opLoop, opBrIf, opEnd, opCall, opDrop            = 0x00, 0x03, 0x0d, 0x0b, 0x10, 0x1a
	opLocalGet, opLocalSet, opI32Const, opI32Eqz, opI32Eq, opI32Sub = 0x20, 0x21, 0x41, 0x45, 0x46, 0x6b
	opRefNull, opPrefix, subTableGrow, blockVoid, typeI32, funcType = 0xd0, 0xfc, 0x0f, 0x40, 0x7f, 0x60
)

func uleb(v uint64) []byte { return binary.AppendUvarint(nil, v) }

// sleb is v in signed LEB128, as i32.const has it.
func sleb(v int64) []byte {
	var out []byte
	for {
		b := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && b&0x40 == 0) || (v == -1 && b&0x40 != 0) {
			return append(out, b)
		}
		out = append(out, b|0x80)
	}
}

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// vec is a vector of items, each already encoded.
func vec(items ...[]byte) []byte { return cat(uleb(uint64(len(items))), cat(items...)) }

func name(s string) []byte { return cat(uleb(uint64(len(s))), []byte(s)) }

func section(id byte, body []byte) []byte { return cat([]byte{id}, uleb(uint64(len(body))), body) }

func wasmModule(sections ...[]byte) []byte {
	return cat([]byte("\x00asm\x01\x00\x00\x00"), cat(sections...))
}

// body is a function's code: its i32 locals, then its instructions.
func body(locals int, code ...[]byte) []byte {
	decl := vec()
	if locals > 0 {
		decl = vec(cat(uleb(uint64(locals)), []byte{typeI32}))
	}
	b := cat(decl, cat(code...), []byte{opEnd})
	return cat(uleb(uint64(len(b))), b)
}

func i32(v int64) []byte { return cat([]byte{opI32Const}, sleb(v)) }

// table is a funcref table's type: its minimum and, when max >= 0, its
// maximum.
func table(min, max int64) []byte {
	if max < 0 {
		return cat([]byte{0x70, 0x00}, uleb(uint64(min)))
	}
	return cat([]byte{0x70, 0x01}, uleb(uint64(min)), uleb(uint64(max)))
}

// growModule has the tables given, and a _start that grows the first by
// n: it exits if the grow fails (returns -1), and traps if it succeeds.
func growModule(n int64, tables ...[]byte) []byte {
	return wasmModule(
		section(secType, vec([]byte{funcType, 0, 0})),
		section(secFunc, vec(uleb(0))),
		section(secTable, vec(tables...)),
		section(secExport, vec(cat(name("_start"), []byte{0x00}, uleb(0)))),
		section(secCode, vec(body(0,
			[]byte{opRefNull, 0x70}, i32(n), []byte{opPrefix, subTableGrow, 0},
			i32(-1), []byte{opI32Eq, opBrIf, 0, opUnreachable}))), // returned -1: return; else trap
	)
}

// recurseModule's _start calls a function that calls itself forever.
func recurseModule() []byte {
	return wasmModule(
		section(secType, vec([]byte{funcType, 0, 0})),
		section(secFunc, vec(uleb(0), uleb(0))),
		section(secExport, vec(cat(name("_start"), []byte{0x00}, uleb(0)))),
		section(secCode, vec(body(0, []byte{opCall, 1}), body(0, []byte{opCall, 1}))),
	)
}

// spewModule writes its 64 KiB page to stdout n times with WASI's
// fd_write, taking no notice of how each write went, then exits with
// code 1.
func spewModule(n int64) []byte {
	write := cat([]byte{funcType}, vec([]byte{typeI32}, []byte{typeI32}, []byte{typeI32}, []byte{typeI32}), vec([]byte{typeI32}))
	exit := cat([]byte{funcType}, vec([]byte{typeI32}), vec())
	start := []byte{funcType, 0, 0}
	iovec := cat(binary.LittleEndian.AppendUint32(nil, 0), binary.LittleEndian.AppendUint32(nil, 64<<10)) // the whole page
	return wasmModule(
		section(secType, vec(write, exit, start)),
		section(secImport, vec(
			cat(name("wasi_snapshot_preview1"), name("fd_write"), []byte{0x00}, uleb(0)),
			cat(name("wasi_snapshot_preview1"), name("proc_exit"), []byte{0x00}, uleb(1)))),
		section(secFunc, vec(uleb(2))),
		section(secMem, vec([]byte{0x00, 1})),
		section(secExport, vec(cat(name("_start"), []byte{0x00}, uleb(2)), cat(name("memory"), []byte{0x02}, uleb(0)))),
		section(secCode, vec(body(1,
			i32(n), []byte{opLocalSet, 0},
			[]byte{opLoop, blockVoid},
			i32(1), i32(0), i32(1), i32(16), []byte{opCall, 0, opDrop}, // fd_write(stdout, iovs 0, 1 of them, nwritten at 16)
			[]byte{opLocalGet, 0}, i32(1), []byte{opI32Sub, opLocalSet, 0},
			[]byte{opLocalGet, 0, opI32Eqz, opI32Eqz, opBrIf, 0, opEnd}, // again while n != 0
			i32(1), []byte{opCall, 1}))),
		section(secData, vec(cat([]byte{0x00}, i32(0), []byte{opEnd}, name(string(iovec))))), // the iovec, at 0
	)
}
