package main

import (
	"strings"

	"k8s.io/klog/v2"
)

// At -v=8 and above client-go logs API request and response bodies, which
// hold Secret data: the filter drops them at every verbosity. klog's filter
// is process-wide and must be set before anything logs, hence init.
func init() { klog.SetLogFilter(bodyFilter{}) }

// omittedBody replaces an API body in the logs.
const omittedBody = "<omitted by syncloop: API bodies may hold Secret data>"

// bodyFilter is a klog.LogFilter that keeps API request and response bodies
// — client-go logs them from -v=8 on, and they hold Secret data — out of
// every log line, whatever the verbosity. The line itself stays, so -v=8
// still shows which requests were made.
type bodyFilter struct{}

// isBody reports whether a log message is client-go's dump of a body.
func isBody(msg string) bool {
	return strings.HasPrefix(msg, "Request Body") || strings.HasPrefix(msg, "Response Body")
}

// FilterS handles structured lines: client-go logs "Request Body" and
// "Response Body" with the body under the key "body".
func (bodyFilter) FilterS(msg string, kv []any) (string, []any) {
	if !isBody(msg) {
		return msg, kv
	}
	out := make([]any, len(kv))
	copy(out, kv)
	for i := 0; i+1 < len(out); i += 2 {
		if out[i] == "body" {
			out[i+1] = omittedBody
		}
	}
	return msg, out
}

// FilterF handles printf-style lines, as older client-go code logs bodies.
func (bodyFilter) FilterF(format string, args []any) (string, []any) {
	if isBody(format) {
		return "%s", []any{strings.TrimSuffix(strings.SplitN(format, "%", 2)[0], ": ") + ": " + omittedBody}
	}
	return format, args
}

// Filter handles print-style lines.
func (bodyFilter) Filter(args []any) []any {
	if len(args) > 0 {
		if s, ok := args[0].(string); ok && isBody(s) {
			return []any{omittedBody}
		}
	}
	return args
}
