package rules

import (
	"context"
	"encoding/base64"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/syncloop/syncloop/rules/function"
)

// Function steps: a resource whose children code computes — a
// WebAssembly module (rules/function runs it) or a webhook — or the rule's
// own function, which computes the trigger's children and status as a
// Metacontroller sync hook does. A module is a file beside the rule file,
// compiled when the rule loads; its digest becomes part of the rule (its
// hash and its recorded source), so a new module is a new revision of the
// rule, rolled out as one.

// Function is a resource's or the rule's function step.
type Function struct {
	// Wasm is the module's file as the rule names it; Digest the sha256
	// of its content, hex.
	Wasm, Digest string
	// Module is nil in a rule compiled for inspection whose module this
	// process has not loaded (Loader.ForInspection): calling it fails.
	// Nil too for a webhook.
	Module *function.Module
	// Webhook, instead of a module, is the endpoint called.
	Webhook *function.Webhook
	// Reads are the resources whose children the function is given, as
	// children.<id>: the resource depends on them.
	Reads  []string
	Limits function.Limits
	// Serve: the module stays up between calls, answering one request
	// per line (function.Module.Serve).
	Serve bool
	// Sync: the rule's function (spec.function), which speaks
	// Metacontroller's sync hook protocol and returns the trigger's status
	// as well as its children.
	Sync bool
	// Finalize, of the rule's function, is called instead of it while the
	// trigger is being deleted, until it answers finalized: the trigger's
	// teardown waits for it (Metacontroller's finalize hook).
	Finalize *Function
	// Customize, of the rule's function, says per trigger which objects
	// its calls are given as related (Metacontroller's customize hook).
	Customize *Function
	// Hook names a function the rule's function has: "finalize" or
	// "customize"; empty for the others.
	Hook string
	// Related, of a customize function, are the kinds it may relate: each
	// a lookup of the rule read only as the function says.
	Related []*Lookup
	// Memo, of a customize function, keeps its answers by trigger.
	Memo *function.Memo
	// Pos and Field are where the rule writes it.
	Pos   Pos
	Field string
}

// SyncResourceID is the id of the resource a rule's function
// (spec.function) is: its children carry it.
const SyncResourceID = "sync"

// MaxFunctionTimeout is the longest a rule may let one call run.
const MaxFunctionTimeout = time.Minute

// DefaultWebhookTimeout is a webhook call's timeout unless the rule says
// otherwise: Metacontroller's.
const DefaultWebhookTimeout = 10 * time.Second

// maxModuleSize bounds a module file: what one reconcile may load.
const maxModuleSize = 64 << 20

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Call calls the function with input: its module, fresh or served, or its
// webhook.
func (fn *Function) Call(ctx context.Context, input []byte) (function.Result, error) {
	switch {
	case fn.Webhook != nil:
		return fn.Webhook.Call(ctx, input, fn.Limits)
	case fn.Module == nil:
		return function.Result{}, fmt.Errorf("module %s (sha256 %.12s) is not loaded in this process: give the rule files (-f) to run it", fn.Wasm, fn.Digest)
	case fn.Serve:
		return fn.Module.Serve(ctx, input, fn.Limits)
	}
	return fn.Module.Call(ctx, input, fn.Limits)
}

// Transport is how the function is called: "wasm" or "webhook".
func (fn *Function) Transport() string {
	if fn.Webhook != nil {
		return "webhook"
	}
	return "wasm"
}

// Name names the function in messages: its module's file or its URL,
// and which hook it is.
func (fn *Function) Name() string {
	name := "module " + fn.Wasm
	if fn.Webhook != nil {
		name = "webhook " + fn.Webhook.URL
	}
	if fn.Hook != "" {
		name = fn.Hook + " " + name
	}
	return name
}

// CallID is how res's calls of fn are named in metrics and in a test's
// responses: the resource's id, and the hook's name after a slash.
func (fn *Function) CallID(res *Resource) string {
	if fn.Hook == "" {
		return res.ID
	}
	return res.ID + "/" + fn.Hook
}

// decodeFunction decodes a function (n, at field; at docPath in the
// rule's document docVal) into res, and loads its module or makes its
// webhook; a module's digest is written into the rule's document, so
// that the rule's hash and source name it. The rule's function
// (spec.function) has its kinds, and may have a finalize function.
func (d *decoder) decodeFunction(res *Resource, n *yaml.Node, field string, docPath []any, docVal any) {
	sync := field == "spec.function"
	known := "spec.resources.function"
	if sync {
		known = field
	}
	f := d.fields(n, field, RuleFormat.known(known)...)
	if f == nil {
		return
	}
	if sync {
		if kn, ok := f["kinds"]; ok {
			d.decodeKindList(res, kn, field)
		} else {
			d.errorf(n, field+".kinds", "required: list every kind the function may return ({apiVersion, kind} each); it fails the trigger on any other")
		}
	}
	if d.tenant != "" {
		d.errorf(n, field, "a tenant rule cannot call code: functions are for the rules syncloop is given")
		return
	}
	fn := d.function(n, f, field, docPath, docVal)
	if fn == nil {
		return
	}
	fn.Sync = sync
	if rn, ok := f["reads"]; ok {
		d.decodeFunctionReads(res, fn, rn, field, docVal)
	}
	if fin, ok := f["finalize"]; ok && sync {
		ff := d.fields(fin, field+".finalize", RuleFormat.known(field+".finalize")...)
		if ff == nil {
			return
		}
		if fn.Finalize = d.function(fin, ff, field+".finalize", append(slices.Clone(docPath), "finalize"), docVal); fn.Finalize == nil {
			return
		}
		fn.Finalize.Sync, fn.Finalize.Hook = true, "finalize"
	}
	if cn, ok := f["customize"]; ok && sync {
		if fn.Customize = d.decodeCustomize(cn, field+".customize", append(slices.Clone(docPath), "customize"), docVal); fn.Customize == nil {
			return
		}
	}
	res.Function = fn
}

// function decodes the fields f of a function (n, at field): how it is
// called and its limits. nil after an error.
func (d *decoder) function(n *yaml.Node, f map[string]*yaml.Node, field string, docPath []any, docVal any) *Function {
	fn := &Function{Pos: d.pos(resolve(n)), Field: field, Limits: function.DefaultLimits}
	_, isWasm := f["wasm"]
	hn, isHook := f["webhook"]
	switch {
	case isWasm && isHook:
		d.errorf(hn, field+".webhook", "a function is a module (wasm) or a webhook, not both")
		return nil
	case !isWasm && !isHook:
		d.errorf(n, field+".wasm", "required (or webhook): the module's file (a WASI command, .wasm), beside the rule file")
		return nil
	case isHook:
		fn.Limits.Timeout = DefaultWebhookTimeout
		for _, k := range []string{"serve", "sha256"} {
			if kn, ok := f[k]; ok {
				d.errorf(kn, field+"."+k, "is for a module: leave it out of a webhook")
			}
		}
	}
	if tn, ok := f["timeout"]; ok {
		if v, ok := d.duration(tn, field+".timeout"); ok {
			if v == 0 || v > MaxFunctionTimeout {
				d.errorf(tn, field+".timeout", "must be more than 0 and at most %s", MaxFunctionTimeout)
			}
			fn.Limits.Timeout = v
		}
	}
	if sn, ok := f["serve"]; ok && isWasm {
		fn.Serve, _ = d.boolean(sn, field+".serve")
	}
	if isHook {
		if fn.Webhook = d.decodeWebhook(hn, field+".webhook"); fn.Webhook == nil {
			return nil
		}
		return fn
	}
	if !d.decodeModule(fn, f, field, docPath, docVal) {
		return nil
	}
	return fn
}

// decodeModule decodes a function's module (f: the function's fields)
// and loads it; it reports whether it did.
func (d *decoder) decodeModule(fn *Function, f map[string]*yaml.Node, field string, docPath []any, docVal any) bool {
	wn := f["wasm"]
	if sn, ok := f["sha256"]; ok {
		if v, ok := d.str(sn, field+".sha256"); ok && !sha256Hex.MatchString(v) {
			d.errorf(sn, field+".sha256", "must be the module's sha256 in 64 lowercase hex digits")
		} else {
			fn.Digest = v
		}
	}
	var ok bool
	if fn.Wasm, ok = d.str(wn, field+".wasm"); !ok {
		return false
	}
	m, digest, err := d.functions.load(d.file, fn.Wasm, fn.Digest, d.fromRevision)
	if err != nil && d.fromRevision && d.absentModules && fn.Digest != "" {
		m, digest, err = nil, fn.Digest, nil // Module nil: it cannot run here
	}
	if err != nil {
		d.errorf(wn, field+".wasm", "%v", err)
		return false
	}
	fn.Module, fn.Digest = m, digest
	if doc, ok := lookup(docVal, docPath).(map[string]any); ok {
		doc["sha256"] = digest
	}
	return true
}

// decodeFunctionReads decodes a resource function's reads (rn): the
// resources whose children it is given, which it depends on.
func (d *decoder) decodeFunctionReads(res *Resource, fn *Function, rn *yaml.Node, field string, docVal any) {
	ids := declaredIDs(docVal, "resources")
	for j, en := range d.seq(rn, field+".reads") {
		ef := fmt.Sprintf("%s.reads[%d]", field, j)
		id, ok := d.str(en, ef)
		switch {
		case !ok:
		case id == res.ID:
			d.errorf(en, ef, "a resource cannot read its own children")
		case !slices.Contains(ids, id):
			d.errorf(en, ef, "no resource %q in spec.resources", id)
		case slices.Contains(fn.Reads, id):
			d.errorf(en, ef, "%q is listed twice", id)
		default:
			fn.Reads = append(fn.Reads, id)
			res.Refs = append(res.Refs, Ref{ID: id, Pos: d.pos(resolve(en))})
		}
	}
}

// decodeWebhook decodes a function's webhook (n, at field): a URL, or an
// in-cluster Service's endpoint, and the CA bundle an https server's
// certificate must chain to.
func (d *decoder) decodeWebhook(n *yaml.Node, field string) *function.Webhook {
	f := d.fields(n, field, RuleFormat.known("spec.resources.function.webhook")...)
	if f == nil {
		return nil
	}
	var url string
	un, hasURL := f["url"]
	sn, hasService := f["service"]
	switch {
	case hasURL && hasService:
		d.errorf(sn, field+".service", "a webhook has a url or a service, not both")
		return nil
	case hasURL:
		url, _ = d.str(un, field+".url")
		if pn, ok := f["path"]; ok {
			d.errorf(pn, field+".path", "is for a service: put the path in the url")
		}
	case hasService:
		url = d.serviceURL(sn, f["path"], field)
	default:
		d.errorf(n, field+".url", "required (or service): where the hook listens")
		return nil
	}
	if url == "" {
		return nil
	}
	var ca []byte
	if cn, ok := f["caBundle"]; ok {
		if v, ok := d.str(cn, field+".caBundle"); ok {
			var err error
			if ca, err = base64.StdEncoding.DecodeString(strings.TrimSpace(v)); err != nil {
				d.errorf(cn, field+".caBundle", "must be base64 of PEM certificates: %v", err)
				return nil
			}
		}
	}
	w, err := function.NewWebhook(url, ca)
	if err != nil {
		at, at_ := un, field+".url"
		if hasService {
			at, at_ = sn, field+".service"
		}
		if len(ca) > 0 {
			at, at_ = f["caBundle"], field+".caBundle"
		}
		d.errorf(at, at_, "%v", err)
		return nil
	}
	return w
}

// serviceURL is the URL of a webhook's service (sn) and path (pn, may
// be nil), as Metacontroller forms it.
func (d *decoder) serviceURL(sn, pn *yaml.Node, field string) string {
	sf := d.fields(sn, field+".service", RuleFormat.known("spec.resources.function.webhook.service")...)
	if sf == nil {
		return ""
	}
	var name, namespace, protocol, path string
	var port int64
	ok := true
	for key, dst := range map[string]*string{"name": &name, "namespace": &namespace, "protocol": &protocol} {
		kn, set := sf[key]
		if !set {
			if key != "protocol" {
				d.errorf(sn, field+".service."+key, "required")
				ok = false
			}
			continue
		}
		v, good := d.str(kn, field+".service."+key)
		ok = ok && good
		*dst = v
	}
	if protocol != "" && protocol != "http" && protocol != "https" {
		d.errorf(sf["protocol"], field+".service.protocol", "must be http or https")
		ok = false
	}
	if pn2, set := sf["port"]; set {
		var good bool
		if port, good = d.integer(pn2, field+".service.port"); good && (port < 1 || port > 65535) {
			d.errorf(pn2, field+".service.port", "must be a port, 1 to 65535")
			good = false
		}
		ok = ok && good
	}
	if pn != nil {
		v, good := d.str(pn, field+".path")
		ok = ok && good
		path = v
	}
	if !ok {
		return ""
	}
	return function.ServiceURL(protocol, name, namespace, int(port), path)
}

// Body is where the resource says what its children are: its template's
// position and field, or its function's.
func (res *Resource) Body() (Pos, string) {
	if res.Function != nil {
		return res.Function.Pos, res.Function.Field
	}
	return res.Template.Pos, res.Template.Field
}

// SetFunctionMemory sets the most linear memory a function's module may
// have (function.DefaultMemory unless set). Call it before the first rule
// with a function loads: the modules share one runtime.
func (l *Loader) SetFunctionMemory(bytes int64) {
	l.functions.mu.Lock()
	defer l.functions.mu.Unlock()
	l.functions.memory = bytes
}

// ForInspection is ForRevisions for a process that reads what syncloop
// recorded without running it (trace): a revision whose module it has not
// loaded still compiles — its rule can be matched and shown — and its
// function fails when called, saying so.
func (l *Loader) ForInspection() *Loader {
	c := l.ForRevisions()
	c.absentModules = true
	return c
}
