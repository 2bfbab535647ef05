package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/rules"
)

// reviewAPIVersion is the ConversionReview version syncloop's CRDs ask
// for (rules.API.CRD) and the only one it reads.
const reviewAPIVersion = "apiextensions.k8s.io/v1"

// What a review is charged, in bytes of heap, before it spends them.
const (
	// perToken and perObject bound what decoding JSON into an any makes
	// beyond the bytes of its strings: every value, key and element costs
	// at most perToken, every object (a map) perObject more. Measured
	// (TestDecodedSize): 12–48 B a token, up to ~300 B an object.
	perToken  = 48
	perObject = 256
	// conversionCopies are the copies of an object a conversion holds at
	// once: the object decoded, the copy rules.API.Convert works on, and
	// the object it makes.
	conversionCopies = 3
	// answerSlack is what an answer may hold beyond twice the objects it
	// answers (a conversion's annotation keeps fields as escaped JSON).
	answerSlack = 64 << 10
)

// bodyCharge is what a review of n bytes is charged before it is read:
// its body, the copy of its objects the envelope holds, and its answer
// (at most twice its objects, and answerSlack).
func bodyCharge(n int64) int64 { return 4*n + answerSlack }

// decodedSize bounds the heap json.Unmarshal makes decoding raw into an
// any, from raw's bytes alone: its length (the strings and keys), and
// perToken for each token that starts a value, key or element — every
// '[', '{', ',' and ':' outside a string, and the first — and perObject
// more for each '{'.
func decodedSize(raw []byte) int64 {
	var tokens, objects int64 = 1, 0
	inString, escaped := false, false
	for _, b := range raw {
		switch {
		case escaped:
			escaped = false
		case inString:
			escaped = b == '\\'
			inString = b != '"'
		case b == '"':
			inString = true
		case b == '{':
			objects++
			tokens++
		case b == '[', b == ',', b == ':':
			tokens++
		}
	}
	return int64(len(raw)) + perToken*tokens + perObject*objects
}

// envelope is a ConversionReview as read, its objects left undecoded:
// what each says it is is checked, and the decode of each charged,
// before any is decoded, and they are decoded one at a time.
type envelope struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Request    *request `json:"request"`
}

type request struct {
	UID               types.UID         `json:"uid"`
	DesiredAPIVersion string            `json:"desiredAPIVersion"`
	Objects           []json.RawMessage `json:"objects"`
}

// head is what an object says it is, read without the rest of it.
type head struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

func decodeEnvelope(body []byte) (*envelope, error) {
	var e envelope
	if err := json.Unmarshal(body, &e); err != nil {
		return nil, fmt.Errorf("not a ConversionReview: %w", err)
	}
	if e.APIVersion != reviewAPIVersion || e.Kind != "ConversionReview" || e.Request == nil {
		return nil, fmt.Errorf("not a %s ConversionReview request: apiVersion %q, kind %q", reviewAPIVersion, e.APIVersion, e.Kind)
	}
	return &e, nil
}

// plan is a review's objects as they say they are, checked: the kind's
// conversion (nil: a kind syncloop does not convert), the version
// wanted, and what decoding them costs.
type plan struct {
	api   *rules.API
	to    schema.GroupVersion
	heads []head
	// largest is the decodedSize of the largest object, size the bytes
	// of them all.
	largest, size int64
	// at is the object the plan's error is about.
	at int
}

// plan checks what each of r's objects says it is — without decoding the
// rest of it — before any is decoded: all of one kind syncloop converts,
// in one of its versions, to one of its versions.
func (c *Converter) plan(r *request) (*plan, error) {
	p := &plan{heads: make([]head, len(r.Objects))}
	to, err := schema.ParseGroupVersion(r.DesiredAPIVersion)
	if err != nil {
		return p, fmt.Errorf("desiredAPIVersion %q: %w", r.DesiredAPIVersion, err)
	}
	p.to = to
	for i, raw := range r.Objects {
		p.at = i
		h := &p.heads[i]
		if err := json.Unmarshal(raw, h); err != nil {
			return p, fmt.Errorf("object %d does not decode: %w", i, err)
		}
		from, err := schema.ParseGroupVersion(h.APIVersion)
		if err != nil {
			return p, fmt.Errorf("object %d: apiVersion %q is not group/version", i, clip(h.APIVersion))
		}
		gk := schema.GroupKind{Group: from.Group, Kind: h.Kind}
		switch {
		case p.api == nil:
			if p.api = c.api(gk); p.api == nil {
				return p, fmt.Errorf("syncloop converts no %s.%s: no rule defines it in versions", clip(h.Kind), clip(from.Group))
			}
		case gk != p.api.GVK.GroupKind():
			return p, fmt.Errorf("a review converts objects of one kind: object %d is a %s, not a %s", i, clip(gk.String()), p.api.GVK.GroupKind())
		}
		if p.api.VersionNamed(from.Version) == nil {
			return p, fmt.Errorf("%s is not a version of %s", clip(h.APIVersion), p.api.CRDName())
		}
		p.largest = max(p.largest, decodedSize(raw))
		p.size += int64(len(raw))
	}
	switch {
	case p.api == nil:
	case to.Group != p.api.GVK.Group:
		return p, fmt.Errorf("%s/%s cannot become a %s object", p.api.GVK.Group, p.api.Kind, to)
	case p.api.VersionNamed(to.Version) == nil:
		return p, fmt.Errorf("%s has no version %s", p.api.CRDName(), to.Version)
	}
	return p, nil
}

// labels are object i's metric labels: the kind's, its version and the
// one wanted when they are the kind's; else OtherLabel.
func (p *plan) labels(i int) (kind, from, to string) {
	kind, from, to = OtherLabel, OtherLabel, OtherLabel
	if p.api == nil {
		return
	}
	kind = p.api.Kind
	if i < len(p.heads) {
		if gv, err := schema.ParseGroupVersion(p.heads[i].APIVersion); err == nil && gv.Group == p.api.GVK.Group && p.api.VersionNamed(gv.Version) != nil {
			from = gv.Version
		}
	}
	if p.to.Group == p.api.GVK.Group && p.api.VersionNamed(p.to.Version) != nil {
		to = p.to.Version
	}
	return kind, from, to
}

// answer is a review's response: the objects converted, in the order
// given, or why they are not; busy when the review did not fit among
// those in flight, to be sent again.
type answer struct {
	uid     types.UID
	objects []json.RawMessage
	err     error
	busy    bool
}

// review converts the objects of r, or fails whole, as the API server
// expects. What every object says it is is checked, and the decode of
// the largest charged to t, before any is decoded; then they are decoded
// and converted one at a time, each dropped once converted.
func (c *Converter) review(ctx context.Context, r *request, t *ticket) answer {
	start := time.Now()
	p, err := c.plan(r)
	if c.Metrics != nil {
		kind, _, _ := p.labels(0)
		defer func() { c.Metrics.Reviewed(kind, time.Since(start)) }()
	}
	if err != nil {
		c.converted(p, p.at, err)
		return answer{uid: r.UID, err: err}
	}
	if charge := conversionCopies * p.largest; !t.grow(charge) {
		if c.gate.fits(t.charged + charge) {
			return answer{busy: true}
		}
		if c.Metrics != nil {
			c.Metrics.Refused(RefusedTooLarge)
		}
		return answer{uid: r.UID, err: fmt.Errorf("converting an object of %s would hold %d bytes, more than all conversions together may (%d)", p.api.CRDName(), charge, c.gate.budget)}
	}
	out, limit := make([]json.RawMessage, 0, len(r.Objects)), 2*p.size+answerSlack
	for i := range r.Objects {
		data, err := c.convert(ctx, p, r.Objects[i], p.heads[i])
		r.Objects[i] = nil
		c.converted(p, i, err)
		if err != nil {
			return answer{uid: r.UID, err: err}
		}
		if limit -= int64(len(data)); limit < 0 {
			return answer{uid: r.UID, err: fmt.Errorf("the %s objects converted are more than twice the size of those given", p.api.Kind)}
		}
		out = append(out, data)
	}
	return answer{uid: r.UID, objects: out}
}

func (c *Converter) converted(p *plan, i int, err error) {
	if c.Metrics == nil {
		return
	}
	result := "converted"
	if err != nil {
		result = "failed"
	}
	kind, from, to := p.labels(i)
	c.Metrics.Converted(kind, from, to, result)
}

// convert decodes one object, as its head says it is, and converts it; a
// panic is contained as its error.
func (c *Converter) convert(ctx context.Context, p *plan, raw json.RawMessage, h head) (data []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("converting %s: panic: %v", h.Kind, r)
			klog.FromContext(ctx).Error(err, "Conversion panicked")
		}
	}()
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("a %s does not decode: %w", h.Kind, err)
	}
	// The head's decode matches keys in any case ("KIND"): the object is
	// the one checked only if its own keys say the same.
	if k, _ := obj["kind"].(string); k != h.Kind {
		return nil, fmt.Errorf("an object says it is a %s, but its kind is %q", h.Kind, k)
	}
	if v, _ := obj["apiVersion"].(string); v != h.APIVersion {
		return nil, fmt.Errorf("a %s says it is %s, but its apiVersion is %q", h.Kind, h.APIVersion, v)
	}
	out, err := p.api.Convert(ctx, obj, p.to.Version)
	if err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

// write writes a as a ConversionReview, the objects converted as they
// are: no other copy of them is made.
func (a answer) write(w http.ResponseWriter) error {
	result := metav1.Status{Status: metav1.StatusSuccess}
	if a.err != nil {
		result = metav1.Status{Status: metav1.StatusFailure, Message: strings.TrimSpace(a.err.Error())}
		a.objects = nil
	}
	uid, err := json.Marshal(a.uid)
	if err != nil {
		return err
	}
	res, err := json.Marshal(result)
	if err != nil {
		return err
	}
	open := `{"apiVersion":"` + reviewAPIVersion + `","kind":"ConversionReview","response":{"uid":` + string(uid) + `,"result":` + string(res) + `,"convertedObjects":[`
	const end = "]}}\n"
	n := len(open) + len(end)
	for i, o := range a.objects {
		n += len(o) + min(i, 1)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(n))
	if _, err := io.WriteString(w, open); err != nil {
		return err
	}
	for i, o := range a.objects {
		if i > 0 {
			if _, err := io.WriteString(w, ","); err != nil {
				return err
			}
		}
		if _, err := w.Write(o); err != nil {
			return err
		}
	}
	_, err = io.WriteString(w, end)
	return err
}

// clip is what a refusal quotes of a value the caller wrote: its first 63
// bytes, and how long it was. Quoted whole, a 16 MiB apiVersion of
// invalid bytes (each decoded as U+FFFD, three) would make the answer six
// times the review, uncharged.
func clip(s string) string {
	const most = 63
	if len(s) <= most {
		return s
	}
	return fmt.Sprintf("%s… (%d bytes)", strings.ToValidUTF8(s[:most], ""), len(s))
}
