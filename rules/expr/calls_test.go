package expr

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/cel-go/common/stdlib"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/interpreter"
)

// TestEveryCallIsCharged: every overload the compiler's environment
// declares beyond cel-go's standard library has a row in callCosts, so
// that a function added later cannot ship uncharged; and every row is an
// overload the environment has, so that none is stale.
func TestEveryCallIsCharged(t *testing.T) {
	c := newCompiler(t, Options{})
	std := map[string]bool{}
	for _, f := range stdlib.Functions() {
		for _, o := range f.OverloadDecls() {
			std[o.ID()] = true
		}
	}
	declared := map[string]bool{}
	for name, f := range c.lib.Functions() {
		for _, o := range f.OverloadDecls() {
			if std[o.ID()] {
				continue
			}
			declared[o.ID()] = true
			if cost, ok := callCosts[o.ID()]; !ok || cost.model == "" {
				t.Errorf("%s (overload %s) has no row in callCosts: say what it is charged", name, o.ID())
			}
		}
	}
	var stale []string
	for id := range callCosts {
		if !declared[id] {
			stale = append(stale, id)
		}
	}
	slices.Sort(stale)
	for _, id := range stale {
		t.Errorf("callCosts has a row for %s, which the environment does not declare", id)
	}
}

// mebi is the size of the worst-case inputs: a trigger is at most about
// 1.5 MB (etcd's limit), so what a call reads of one is about 1 MB.
const mebi = 1 << 20

// worstCase is an object of ~1 MB values of every kind the functions
// read: s a string of 1 MiB, half one of 512 KiB, b 1 MiB of bytes, b64
// their base64, list 65,536 strings of 16 bytes, ints 100,000 numbers,
// data a map of 25,000 entries (1 MB), j a JSON document of 1 MiB.
func worstCase() map[string]any {
	list := make([]any, mebi/16)
	for i := range list {
		list[i] = fmt.Sprintf("item-%011d", i)
	}
	ints := make([]any, 100_000)
	for i := range ints {
		ints[i] = int64(i)
	}
	data := map[string]any{}
	for i := range 25_000 {
		data[fmt.Sprintf("key-%06d", i)] = strings.Repeat("v", 30)
	}
	b := bytes.Repeat([]byte{0xff}, mebi)
	return map[string]any{
		"s": strings.Repeat("a", mebi), "half": strings.Repeat("a", mebi/2), "small": strings.Repeat("a", 10_000),
		"b": b, "b64": base64.StdEncoding.EncodeToString(b), "list": list, "ints": ints, "data": data,
		"j": `"` + strings.Repeat("x", mebi) + `"`, "jhalf": `"` + strings.Repeat("x", mebi/2) + `"`,
	}
}

// TestCallsChargedByWork: each function syncloop adds, over a worst-case
// ~1 MB input (once), is refused before the call by the limit — the
// error names the call: it was measured, not run — or runs and is
// charged at least by its work (least); and a comprehension calling it
// over a large value (many) is stopped by the limit, each call charged
// by its work, not as one step.
func TestCallsChargedByWork(t *testing.T) {
	c := newCompiler(t, Options{})
	obj := worstCase()
	const refused = 0 // once is refused before the call
	for _, tc := range []struct {
		call, once string
		least      uint64 // what once is charged at least, or refused
		many       string
	}{
		// kro's.
		{"random.seededString", "random.seededString(2000000, 'x')", refused, "lists.range(1000).all(i, random.seededString(5000, 'x').size() > 0)"},
		{"random.seededInt", "random.seededInt(0, 10, object.s)", refused, "lists.range(100).all(i, random.seededInt(0, 10, object.half) >= 0)"},
		{"hash.sha256", "hash.sha256(object.s)", refused, "lists.range(100).all(i, hash.sha256(object.half).size() > 0)"},
		{"hash.md5", "hash.md5(object.half).size()", mebi / 2, "lists.range(100).all(i, hash.md5(object.half).size() > 0)"},
		{"hash.fnv64a", "hash.fnv64a(object.s)", refused, "lists.range(100).all(i, hash.fnv64a(object.half).size() > 0)"},
		{"json.unmarshal", "json.unmarshal(object.j)", refused, "lists.range(100).all(i, json.unmarshal(object.jhalf).size() > 0)"},
		{"json.marshal", "json.marshal(object.data)", refused, "lists.range(100).all(i, json.marshal(object.small).size() > 0)"},
		{"lists.setAtIndex", "lists.setAtIndex(object.list, 0, 'x').size()", mebi / 16, "lists.range(100).all(i, lists.setAtIndex(object.list, 0, 'x').size() > 0)"},
		{"lists.insertAtIndex", "lists.insertAtIndex(object.list, 0, 'x').size()", mebi / 16, "lists.range(100).all(i, lists.insertAtIndex(object.list, 0, 'x').size() > 0)"},
		{"lists.removeAtIndex", "lists.removeAtIndex(object.list, 0).size()", mebi / 16, "lists.range(100).all(i, lists.removeAtIndex(object.list, 0).size() > 0)"},
		{"merge", "object.data.merge(object.data).size()", 100_000, "lists.range(100).all(i, object.data.merge(object.data).size() > 0)"},
		{"deepMerge", "{'m': object.data}.deepMerge({'m': object.data}).size()", 100_000, "lists.range(400).map(i, {'m': object.data}.deepMerge({'m': object.data})).size()"},
		// cel-go's strings; object.s is dyn, so reverse, indexOf and
		// lastIndexOf are dispatched when they run (string or list).
		{"indexOf", "object.s.indexOf(object.half + 'b')", refused, "lists.range(1000).all(i, object.s.indexOf('b') < 0)"},
		{"indexOf", "string(object.s).indexOf(object.half + 'b')", refused, "lists.range(1000).all(i, string(object.s).indexOf('b') < 0)"},
		{"lastIndexOf", "object.s.lastIndexOf('b' + object.half)", refused, "lists.range(1000).all(i, object.s.lastIndexOf('b') < 0)"},
		{"reverse", "object.s.reverse()", refused, "lists.range(100).all(i, object.half.reverse().size() > 0)"},
		{"replace", "object.s.replace('a', object.s)", refused, "lists.range(100).all(i, object.half.replace('a', 'b').size() > 0)"},
		{"replace", "'x'.replace('', object.half)", refused, "lists.range(100).all(i, object.small.replace('a', 'bb').size() > 0)"},
		{"join", "lists.range(2000).map(i, object.s).join()", refused, "lists.range(100).all(i, object.list.slice(0, 20000).join(',').size() > 0)"},
		{"format", "'%s'.format([lists.range(1000).map(i, object.list)])", refused, "lists.range(100).all(i, '%s'.format([object.list]).size() > 0)"},
		{"upperAscii", "object.half.upperAscii().size()", mebi / 2, "lists.range(100).all(i, object.half.upperAscii().size() > 0)"},
		{"substring", "object.half.substring(1).size()", mebi / 2, "lists.range(100).all(i, object.half.substring(1).size() > 0)"},
		{"split", "object.half.split('').size()", mebi / 2, "lists.range(100).all(i, object.half.split('').size() > 0)"},
		{"charAt", "object.s.charAt(1)", mebi / 10, "lists.range(100).all(i, object.s.charAt(1) == 'a')"},
		{"strings.quote", "strings.quote(object.s).size()", mebi / 10, "lists.range(100).all(i, strings.quote(object.s).size() > 0)"},
		// cel-go's lists, sets, math and encoders.
		{"flatten", "object.list.slice(0, 2000).map(k, object.list).flatten().size()", refused, "lists.range(100).all(i, [object.list].flatten().size() > 0)"},
		{"flatten", "cel.bind(l, object.list, object.list.slice(0, 2000).map(k, l)).flatten().size()", refused, "lists.range(100).all(i, [[object.list]].flatten(2).size() > 0)"},
		{"reverse", "object.list.reverse().size()", mebi / 16, "lists.range(100).all(i, object.list.reverse().size() > 0)"},
		{"distinct", "object.list.distinct().size()", refused, "lists.range(100).all(i, object.list.slice(0, 500).distinct().size() > 0)"},
		{"sort", "object.list.sort().size()", 2 * (mebi / 16) * (mebi / 16), "lists.range(1000).all(i, object.list.slice(0, 300).sort().size() > 0)"},
		{"sortBy", "object.list.slice(0, 3000).sortBy(x, x).size()", 2 * 3000 * 3000, "lists.range(1000).all(i, object.list.slice(0, 300).sortBy(x, x).size() > 0)"},
		{"sets.contains", "sets.contains(object.list, object.list)", refused, "lists.range(100).all(i, sets.contains([object.list], [object.list]))"},
		{"sets.intersects", "sets.intersects(object.list, object.list)", refused, "lists.range(100).all(i, sets.intersects([object.list], [object.list]))"},
		{"sets.equivalent", "sets.equivalent(object.list, object.list)", refused, "lists.range(100).all(i, sets.equivalent([object.list], [object.list]))"},
		{"sets.contains", "sets.contains([object.list], [object.list])", 3 * mebi / 16, "lists.range(100).all(i, sets.contains(object.list.slice(0, 900), object.list.slice(0, 900)))"},
		{"math.greatest", "math.greatest(object.ints)", 100_000, "lists.range(100).all(i, math.greatest(object.ints) > 0)"},
		{"math.least", "math.least(object.ints)", 100_000, "lists.range(100).all(i, math.least(object.ints) >= 0)"},
		{"base64.encode", "base64.encode(object.b)", refused, "cel.bind(b, bytes(object.half), lists.range(100).all(i, base64.encode(b).size() > 0))"},
		{"base64.decode", "base64.decode(object.b64)", refused, "lists.range(100).all(i, base64.decode(object.b64.substring(0, 600000)).size() > 0)"},
		{"json.encode", "json.encode(object.data)", refused, "lists.range(100).all(i, json.encode(object.small).size() > 0)"},
		{"optional.unwrap", "optional.unwrap(lists.range(5000).map(x, optional.of(x))).size()", 5000, "cel.bind(o, lists.range(5000).map(x, optional.of(x)), lists.range(300).all(i, optional.unwrap(o).size() > 0))"},
		// The Kubernetes library's.
		{"isURL", "isURL(object.half)", mebi / 20, "cel.bind(u, 'https://x/' + object.half, lists.range(100).all(i, isURL(u)))"},
		{"getQuery", "url('https://x/?' + object.s).getQuery()", refused, "cel.bind(u, url('https://x/?' + object.half), lists.range(100).all(i, u.getQuery().size() > 0))"},
		{"getEscapedPath", "url('https://x/' + object.s).getEscapedPath()", refused, "cel.bind(u, url('https://x/' + object.half), lists.range(100).all(i, u.getEscapedPath().size() > 0))"},
		{"find", "object.s.find(object.half)", refused, "lists.range(1000).all(i, object.s.find('b') == '')"},
		{"findAll", "object.s.findAll(object.half)", refused, "lists.range(1000).all(i, object.s.findAll('b').size() == 0)"},
		{"sum", "object.ints.sum()", 100_000, "lists.range(100).all(i, object.ints.sum() > 0)"},
		{"isSorted", "object.ints.isSorted()", 100_000, "lists.range(100).all(i, object.ints.isSorted())"},
		{"max", "object.list.max()", mebi / 16, "lists.range(100).all(i, object.list.max() != '')"},
		{"indexOf", "object.list.indexOf('zz')", mebi / 16, "lists.range(100).all(i, object.list.indexOf('zz') < 0)"},
		{"lastIndexOf", "object.list.lastIndexOf('zz')", mebi / 16, "lists.range(100).all(i, object.list.lastIndexOf('zz') < 0)"},
	} {
		t.Run(tc.call+"/"+tc.once, func(t *testing.T) {
			p, err := c.Compile(tc.once, Scope{}, AnyResult)
			if err != nil {
				t.Fatal(err)
			}
			if tc.least == refused {
				_, err := p.Eval(context.Background(), &Activation{Object: obj})
				if !errors.Is(err, ErrCostLimit) || !strings.Contains(err.Error(), tc.call+" over") {
					t.Errorf("err = %v, want the cost limit, the call refused before it was made", err)
				}
			} else {
				act, err := interpreter.NewActivation((&Activation{Object: obj}).vars(nil))
				if err != nil {
					t.Fatal(err)
				}
				_, details, err := p.prog.ContextEval(context.Background(), act)
				if actual := *details.ActualCost(); err == nil && actual < tc.least {
					t.Errorf("charged %d, less than its work (%d)", actual, tc.least)
				} else if err != nil && !strings.Contains(err.Error(), "cost limit") {
					t.Errorf("err = %v, want the call to run, or the limit", err)
				}
			}
			p, err = c.Compile(tc.many, Scope{}, AnyResult)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Eval(context.Background(), &Activation{Object: obj}); !errors.Is(err, ErrCostLimit) {
				t.Errorf("%s: err = %v, want the cost limit", tc.many, err)
			}
		})
	}
}

// counted is a list or map that counts every element, key or value read
// of it into reads.
type countedList struct {
	traits.Lister
	reads *int64
}

func (l countedList) Get(i ref.Val) ref.Val { *l.reads++; return l.Lister.Get(i) }
func (l countedList) Iterator() traits.Iterator {
	return countedIterator{Iterator: l.Lister.Iterator(), reads: l.reads}
}

type countedMap struct {
	traits.Mapper
	reads *int64
}

func (m countedMap) Get(k ref.Val) ref.Val { *m.reads++; return m.Mapper.Get(k) }
func (m countedMap) Find(k ref.Val) (ref.Val, bool) {
	*m.reads++
	return m.Mapper.Find(k)
}
func (m countedMap) Iterator() traits.Iterator {
	return countedIterator{Iterator: m.Mapper.Iterator(), reads: m.reads}
}

type countedIterator struct {
	traits.Iterator
	reads *int64
}

func (it countedIterator) Next() ref.Val { *it.reads++; return it.Iterator.Next() }

// shared is a list of two of one list of two of … depth levels down, and
// a map of the same shape: 2^depth leaves, read whole, of a few dozen
// values — what cel.bind(a, [b, b], …) builds. Every read is counted.
func shared(depth int, reads *int64) (list, dict ref.Val) {
	list = countedList{Lister: types.NewRefValList(types.DefaultTypeAdapter, []ref.Val{types.Int(1), types.Int(2)}), reads: reads}
	dict = countedMap{Mapper: types.NewRefValMap(types.DefaultTypeAdapter, map[ref.Val]ref.Val{types.String("v"): types.Int(1)}), reads: reads}
	for range depth {
		list = countedList{Lister: types.NewRefValList(types.DefaultTypeAdapter, []ref.Val{list, list}), reads: reads}
		dict = countedMap{Mapper: types.NewRefValMap(types.DefaultTypeAdapter,
			map[ref.Val]ref.Val{types.String("x"): dict, types.String("y"): dict}), reads: reads}
	}
	return list, dict
}

// TestCallsMeasureBounded: a call whose work is what its arguments hold
// at every depth is measured before it is made by a walk that stops at
// the limit — over values whose parts are shared, 2^60 leaves read
// whole, the call is refused having read a few times the limit, where a
// walk to the end never returns (the API server's list traversal, which
// sum and indexOf were charged by after the call, walked it whole).
func TestCallsMeasureBounded(t *testing.T) {
	const limit = 10_000
	c := newCompiler(t, Options{CostLimit: limit})
	for call, src := range map[string]string{
		"flatten":       "object.dag.flatten(100)",
		"json.marshal":  "json.marshal(object.dag)",
		"json.encode":   "json.encode(object.map)",
		"format":        "'%s'.format([object.dag])",
		"indexOf":       "object.dag.indexOf(object.dag[0])",
		"sets.contains": "sets.contains([object.dag], [object.dag])",
		"distinct":      "[object.dag, object.dag].distinct()",
		"deepMerge":     "object.map.deepMerge(object.map)",
	} {
		var reads int64
		list, dict := shared(60, &reads)
		p, err := c.Compile(src, Scope{}, AnyResult)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		_, err = p.Eval(context.Background(), &Activation{Object: map[string]any{"dag": list, "map": dict}})
		if !errors.Is(err, ErrCostLimit) || !strings.Contains(err.Error(), call+" over") {
			t.Errorf("%s: err = %v, want the call refused before it was made", src, err)
		}
		if reads > 4*limit {
			t.Errorf("%s: %d reads to refuse it, more than 4 × the limit of %d", src, reads, limit)
		}
	}
	// A list of lists is no list of numbers: sum and isSorted are not
	// made, and what the tracker charges for trying is measured as far as
	// the limit.
	for _, src := range []string{"object.dag.sum()", "object.dag.isSorted()", "object.dag.max()"} {
		var reads int64
		list, _ := shared(60, &reads)
		p, err := c.Compile(src, Scope{}, AnyResult)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if _, err := p.Eval(context.Background(), &Activation{Object: map[string]any{"dag": list}}); !errors.Is(err, ErrCostLimit) {
			t.Errorf("%s: err = %v, want the cost limit", src, err)
		}
		if reads > 4*limit {
			t.Errorf("%s: %d reads to charge it, more than 4 × the limit of %d", src, reads, limit)
		}
	}
}
