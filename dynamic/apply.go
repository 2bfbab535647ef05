package dynamic

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes/scheme"
)

// Writer performs syncloop's writes: server-side apply of objects and of
// status, and deletes with a UID precondition. With DryRun set every request
// is a server-side dry run (dryRun=All): the server defaults, validates and
// admits, and persists nothing.
type Writer struct {
	Client *Client
	DryRun bool
}

func (w *Writer) resource(m *meta.RESTMapping, namespace string) dynamic.ResourceInterface {
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return w.Client.Dynamic.Resource(m.Resource).Namespace(namespace)
	}
	return w.Client.Dynamic.Resource(m.Resource)
}

func (w *Writer) dryRun() []string {
	if w.DryRun {
		return []string{metav1.DryRunAll}
	}
	return nil
}

// Get reads one object from the API server (a consistent read), also in a
// dry run.
func (w *Writer) Get(ctx context.Context, m *meta.RESTMapping, namespace, name string) (*unstructured.Unstructured, error) {
	return w.resource(m, namespace).Get(ctx, name, metav1.GetOptions{})
}

// fieldValidation is the directive every apply is sent with: Ignore. The
// API server's default, Warn, has it decode an apply's body a second time,
// strictly, only to warn of duplicate keys and unknown fields — a tenth
// of its CPU for a small child (docs/how-it-works.md). A body syncloop
// sends is encoded from a map, so it has no duplicate key, and server-side
// apply refuses an unknown field whatever the directive ("field not
// declared in schema"): the second decode could find nothing.
const fieldValidation = metav1.FieldValidationIgnore

// Apply server-side applies obj as fieldManager and returns the object as
// the server has it afterwards.
func (w *Writer) Apply(ctx context.Context, m *meta.RESTMapping, obj *unstructured.Unstructured, fieldManager string, force bool) (*unstructured.Unstructured, error) {
	return w.apply(ctx, m, obj, fieldManager, force)
}

// apply server-side applies obj, or with subresources one of its
// subresources.
func (w *Writer) apply(ctx context.Context, m *meta.RESTMapping, obj *unstructured.Unstructured, fieldManager string, force bool, subresources ...string) (*unstructured.Unstructured, error) {
	body, err := MarshalJSON(obj.Object)
	if err != nil {
		return nil, err
	}
	opts := metav1.PatchOptions{FieldManager: fieldManager, Force: &force, DryRun: w.dryRun(), FieldValidation: fieldValidation}
	return w.resource(m, obj.GetNamespace()).Patch(ctx, obj.GetName(), types.ApplyPatchType, body, opts, subresources...)
}

// ApplyVersion server-side applies obj as Apply does, and returns only the
// resourceVersion the server answered with: the answer — the whole object,
// managedFields included — is read no further than its metadata's
// resourceVersion, which a caller that needs only the version is spared.
// The options are the query parameters the dynamic client's codec would
// make of apply's, set directly (the codec converts them by
// reflection at every request), and the body is encoded by MarshalJSON.
//
// A kind of client-go's is answered in protobuf where its informers list
// in protobuf (Protobuf.serves): the answer is a quarter smaller and
// cheaper for the API server to encode than its JSON — the answer a
// hand-written controller's typed client gets. The body stays JSON: an
// apply's body is YAML or JSON.
func (w *Writer) ApplyVersion(ctx context.Context, m *meta.RESTMapping, obj *unstructured.Unstructured, fieldManager string, force bool) (string, error) {
	body, err := MarshalJSON(obj.Object)
	if err != nil {
		return "", err
	}
	client := w.Client.rest
	if pb := w.Client.protobuf; pb.serves(ctx, m.Resource) && scheme.Scheme.Recognizes(m.GroupVersionKind) {
		client = pb.rest // accepts protobuf, then JSON
	}
	at, err := objectPath(m, obj.GetNamespace(), obj.GetName())
	if err != nil {
		return "", err
	}
	req := client.Patch(types.ApplyYAMLPatchType).Body(body).AbsPath(at...).
		Param("fieldManager", fieldManager).Param("fieldValidation", fieldValidation)
	if force {
		req = req.Param("force", "true")
	}
	if w.DryRun {
		req = req.Param("dryRun", metav1.DryRunAll)
	}
	// Stream, not Do: a refusal comes back as Do reports it (the server's
	// Status), and a success's answer is read into a buffer of answers'
	// rather than a new one grown to its size.
	stream, err := req.Stream(ctx)
	if err != nil {
		return "", err
	}
	buf := answerBuffers.Get().(*[]byte)
	answer, err := readInto((*buf)[:0], stream)
	stream.Close()
	if cap(answer) <= maxAnswerBuffer {
		*buf = answer[:0]
		defer answerBuffers.Put(buf)
	}
	if err != nil {
		return "", fmt.Errorf("reading the answer to an apply: %w", err)
	}
	read := answerVersion
	if bytes.HasPrefix(answer, protobufMagic) {
		read = answerVersionProtobuf
	}
	rv, err := read(answer)
	if err != nil {
		return "", fmt.Errorf("decoding the answer to an apply: %w", err)
	}
	return rv, nil
}

// answerBuffers hold the buffers apply answers are read into, one per
// apply under way; maxAnswerBuffer is the largest kept (an answer is the
// object, a few KB for most children).
var answerBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

const maxAnswerBuffer = 64 << 10

// readInto appends what r reads until its end to b, as io.ReadAll does to
// a new slice.
func readInto(b []byte, r io.Reader) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		switch {
		case err == io.EOF:
			return b, nil
		case err != nil:
			return b, err
		}
	}
}

// protobufMagic begins every object the API server encodes in protobuf.
var protobufMagic = []byte("k8s\x00")

// answerVersionProtobuf reads metadata.resourceVersion from an object in
// the API server's protobuf encoding, as answerVersion does from its JSON:
// after the magic number, the envelope (runtime.Unknown) holds the
// object's encoding in its field 2; every kind of client-go's holds its
// ObjectMeta in its field 1 (TestMetadataIsFieldOne checks each), and
// ObjectMeta its resourceVersion in field 6. Other fields are skipped by
// their lengths; an object without one gives "".
func answerVersionProtobuf(body []byte) (string, error) {
	envelope, ok := bytes.CutPrefix(body, protobufMagic)
	if !ok {
		return "", errors.New("not protobuf: no magic number")
	}
	if encoding, err := protoField(envelope, 3); err != nil || len(encoding) > 0 {
		return "", fmt.Errorf("an envelope with content encoding %q: %v", encoding, err)
	}
	raw, err := protoField(envelope, 2)
	if err != nil {
		return "", err
	}
	md, err := protoField(raw, 1)
	if err != nil {
		return "", err
	}
	rv, err := protoField(md, 6)
	return string(rv), err
}

// protoField is the value of field num of msg, a length-delimited one
// (bytes, a string or a message; nil when msg has none): the last one, as
// protobuf decoders take a scalar field given twice.
func protoField(msg []byte, num protowire.Number) ([]byte, error) {
	var value []byte
	for len(msg) > 0 {
		n, typ, l := protowire.ConsumeTag(msg)
		if l < 0 {
			return nil, protowire.ParseError(l)
		}
		msg = msg[l:]
		if n == num && typ == protowire.BytesType {
			v, l := protowire.ConsumeBytes(msg)
			if l < 0 {
				return nil, protowire.ParseError(l)
			}
			value, msg = v, msg[l:]
			continue
		}
		if l = protowire.ConsumeFieldValue(n, typ, msg); l < 0 {
			return nil, protowire.ParseError(l)
		}
		msg = msg[l:]
	}
	return value, nil
}

// answerVersion reads metadata.resourceVersion from an object's JSON in
// one pass that stops there: the API server writes metadata before the
// object's content and resourceVersion before labels, annotations and
// managedFields, so a few hundred bytes of a write's answer are read, not
// the whole of it twice (encoding/json validates all of its input before
// decoding any). Keys in another order are found all the same, values
// skipped by their brackets and quotes; an object without one gives "".
func answerVersion(body []byte) (string, error) {
	s := &jsonScan{b: body}
	rv := ""
	err := s.object(func(key string) (bool, error) {
		if key != "metadata" {
			return false, s.skip()
		}
		found := false
		err := s.object(func(key string) (bool, error) {
			if key != "resourceVersion" {
				return false, s.skip()
			}
			found = true
			var err error
			rv, err = s.str()
			return true, err
		})
		return found, err
	})
	return rv, err
}

// jsonScan reads JSON a value at a time from b, from i on.
type jsonScan struct {
	b []byte
	i int
}

func (s *jsonScan) space() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

// next reads the byte after spaces; 0 at the end.
func (s *jsonScan) next() byte {
	s.space()
	if s.i == len(s.b) {
		return 0
	}
	s.i++
	return s.b[s.i-1]
}

func (s *jsonScan) fail(c byte) error {
	if c == 0 {
		return errors.New("unexpected end of JSON input")
	}
	return fmt.Errorf("invalid character %q at offset %d", c, s.i-1)
}

// object reads an object's members, calling each with a member's key,
// the scan at its value, which each reads or skips; it stops when each is
// done.
func (s *jsonScan) object(each func(key string) (done bool, err error)) error {
	if c := s.next(); c != '{' {
		return s.fail(c)
	}
	s.space()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return nil
	}
	for {
		key, err := s.str()
		if err != nil {
			return err
		}
		if c := s.next(); c != ':' {
			return s.fail(c)
		}
		if done, err := each(key); done || err != nil {
			return err
		}
		switch c := s.next(); c {
		case ',':
		case '}':
			return nil
		default:
			return s.fail(c)
		}
	}
}

// str reads a string.
func (s *jsonScan) str() (string, error) {
	if c := s.next(); c != '"' {
		return "", s.fail(c)
	}
	start, escaped := s.i-1, false
	for ; s.i < len(s.b); s.i++ {
		switch s.b[s.i] {
		case '\\':
			escaped = true
			s.i++
		case '"':
			s.i++
			if !escaped {
				return string(s.b[start+1 : s.i-1]), nil
			}
			var v string
			err := json.Unmarshal(s.b[start:s.i], &v)
			return v, err
		}
	}
	return "", s.fail(0)
}

// skip passes over one value: a string, an object or array (to its
// closing bracket, strings inside passed whole) or a literal.
func (s *jsonScan) skip() error {
	s.space()
	if s.i == len(s.b) {
		return s.fail(0)
	}
	switch s.b[s.i] {
	case '"':
		_, err := s.str()
		return err
	case '{', '[':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				if _, err := s.str(); err != nil {
					return err
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					s.i++
					return nil
				}
			}
			s.i++
		}
		return s.fail(0)
	}
	start := s.i
	for s.i < len(s.b) && !strings.ContainsRune(",}] \t\n\r", rune(s.b[s.i])) {
		s.i++
	}
	if s.i == start {
		return s.fail(s.b[s.i])
	}
	return nil
}

// ApplyStatus server-side applies obj's status through the status
// subresource.
func (w *Writer) ApplyStatus(ctx context.Context, m *meta.RESTMapping, obj *unstructured.Unstructured, fieldManager string, force bool) (*unstructured.Unstructured, error) {
	return w.apply(ctx, m, obj, fieldManager, force, "status")
}

// Delete deletes namespace/name if — and only if — its UID is still uid.
// propagation says how the garbage collector removes the object's own
// dependents: Background (after the object is gone) or Foreground (the
// object stays, being deleted, until they are gone).
func (w *Writer) Delete(ctx context.Context, m *meta.RESTMapping, namespace, name string, uid types.UID, propagation metav1.DeletionPropagation) error {
	return w.resource(m, namespace).Delete(ctx, name, metav1.DeleteOptions{
		Preconditions:     &metav1.Preconditions{UID: &uid},
		PropagationPolicy: &propagation,
		DryRun:            w.dryRun(),
	})
}
