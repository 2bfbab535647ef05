package dynamic

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/validate/content"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// Client is how syncloop reaches the API server: the dynamic client, for
// informers and whole objects, and the REST client beneath it (the same
// connection) for writes whose answer syncloop needs only the metadata of.
type Client struct {
	Dynamic dynamic.Interface
	rest    rest.Interface
	config  *rest.Config
	// protobuf lists and watches client-go's kinds in protobuf, on the
	// same connections.
	protobuf *Protobuf
}

// NewClient makes a Client from cfg, as dynamic.NewForConfig would.
func NewClient(cfg *rest.Config) (*Client, error) {
	config := dynamic.ConfigFor(cfg)
	config.GroupVersion = nil
	config.APIPath = "/if-you-see-this-search-for-the-break"
	config.Wrap(bufferWatches)
	httpClient, err := rest.HTTPClientFor(config)
	if err != nil {
		return nil, err
	}
	rc, err := rest.UnversionedRESTClientForConfigAndClient(config, httpClient)
	if err != nil {
		return nil, err
	}
	pb, err := newProtobuf(config, httpClient, rc)
	if err != nil {
		return nil, err
	}
	return &Client{Dynamic: dynamic.New(rc), rest: rc, config: rest.CopyConfig(cfg), protobuf: pb}, nil
}

// Protobuf is how informers list and watch client-go's kinds in protobuf
// (Registry.Protobuf); nil for a nil Client.
func (c *Client) Protobuf() *Protobuf {
	if c == nil {
		return nil
	}
	return c.protobuf
}

// Impersonating is a Client whose requests impersonate user (the API
// server authorizes them as user; the identity of c must be allowed to
// impersonate it). It shares c's connections, the wrappers of its
// transport (flow control) and its client-side rate limit: N identities
// do not make N times the requests a --qps allows.
func (c *Client) Impersonating(user string) (*Client, error) {
	cfg := rest.CopyConfig(c.config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	cfg.RateLimiter = c.rest.GetRateLimiter()
	return NewClient(cfg)
}

// optionsVersion is the version options are encoded in, and
// parameterCodec encodes them as query parameters, as the dynamic client
// does.
var (
	optionsVersion = schema.GroupVersion{Version: "v1"}
	parameterCodec = func() runtime.ParameterCodec {
		s := runtime.NewScheme()
		metav1.AddToGroupVersion(s, optionsVersion)
		return runtime.NewParameterCodec(s)
	}()
)

// objectPath is the URL path of namespace/name of m's resource, as the
// dynamic client builds it — and checks first, as it does, that each is
// one segment of a path: a name such as "../../x" or "a/status" addresses
// nothing but the object it names.
func objectPath(m *meta.RESTMapping, namespace, name string) ([]string, error) {
	if m.Scope.Name() != meta.RESTScopeNameNamespace {
		namespace = ""
	}
	if name == "" {
		return nil, errors.New("an object's name is required")
	}
	for what, v := range map[string]string{"name": name, "namespace": namespace} {
		if msgs := content.IsPathSegmentName(v); v != "" && len(msgs) > 0 {
			return nil, fmt.Errorf("invalid %s %q: %s", what, v, strings.Join(msgs, "; "))
		}
	}
	return append(collectionPath(m.Resource, namespace), name), nil
}

// watchBuffer is how much of a watch's stream is read from the connection
// at once, when that much has come.
//
// Why: over HTTP/2 the client grants the API server more window each time
// it has read 4 KB of a stream (and of the connection), one WINDOW_UPDATE
// written to the socket per grant, and client-go's watch decoders read an
// event at a time — a protobuf one in two reads, its length and its bytes.
// Reading up to this much at once, as a burst of events (a watch's initial
// list, a thousand children made in a second) allows, takes one grant per
// read instead of one per 4 KB: measured on 5,000 Tenants and their
// children, the writes of grants were a tenth of syncloop's CPU
// (docs/how-it-works.md). A read takes what has come and never waits for
// more: events arriving one by one are handed on as they arrive.
const watchBuffer = 32 << 10

// bufferWatches reads the streams of rt's watches through a buffer of
// watchBuffer bytes; it has the signature of rest.Config.Wrap's argument.
func bufferWatches(rt http.RoundTripper) http.RoundTripper { return &watchReader{next: rt} }

type watchReader struct{ next http.RoundTripper }

func (t *watchReader) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusOK && isWatch(req) {
		resp.Body = &bufferedBody{Reader: bufio.NewReaderSize(resp.Body, watchBuffer), Closer: resp.Body}
	}
	return resp, err
}

// WrappedRoundTripper lets client-go find the transport underneath.
func (t *watchReader) WrappedRoundTripper() http.RoundTripper { return t.next }

// bufferedBody is a response body read through a buffer.
type bufferedBody struct {
	*bufio.Reader
	io.Closer
}
