package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/syncloop/syncloop/internal/testenv"
)

// The function phase: N triggers whose one child comes from a
// WebAssembly function (bench/fn, the benchmark template's child computed
// in Go), served and started afresh per call, and from a webhook doing
// the same, against the same rule as a template — each converged by
// syncloop in process, in one run.

// webhookRule is the benchmark rule with its child from a webhook at URL
// (hookHandler, in the benchmark's process).
const webhookRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: bench}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: bench-trigger}
  resources:
    - id: child
      kinds: [{apiVersion: v1, kind: ConfigMap}]
      function: {webhook: {url: 'URL'}}
  resyncPeriod: "0"
`

// hookHandler is bench/fn as a webhook: the same child, over HTTP.
func hookHandler(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Object struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Data map[string]string `json:"data"`
		} `json:"object"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	name := in.Object.Metadata.Name
	_ = json.NewEncoder(w).Encode(map[string]any{"children": []any{map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": name + "-child"},
		"data":     map[string]any{"from": name, "value": in.Object.Data["value"]},
	}}})
}

// functionRule is the benchmark rule with its child from bench/fn;
// SERVE is true or false.
const functionRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: bench}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: bench-trigger}
  resources:
    - id: child
      kinds: [{apiVersion: v1, kind: ConfigMap}]
      function: {wasm: fn.wasm, serve: SERVE}
  resyncPeriod: "0"
`

// FunctionResult is the function phase's outcome: each way's time from
// syncloop's start to the N-th child, and the process's CPU meanwhile.
type FunctionResult struct {
	Triggers        int     `json:"triggers"`
	TemplateSeconds float64 `json:"templateSeconds"`
	TemplateCPU     float64 `json:"templateCPU"`
	ServedSeconds   float64 `json:"servedSeconds"`
	ServedCPU       float64 `json:"servedCPU"`
	FreshSeconds    float64 `json:"freshSeconds"`
	FreshCPU        float64 `json:"freshCPU"`
	// Webhook*: the child from a webhook in the benchmark's process
	// (its CPU counted with syncloop's: one process).
	WebhookSeconds float64 `json:"webhookSeconds"`
	WebhookCPU     float64 `json:"webhookCPU"`
	// Ratio is served / template convergence (the target: at
	// most 1.5).
	Ratio float64 `json:"ratio"`
}

// runFunction converges n triggers three ways: template, function served,
// function started afresh per call.
func runFunction(ctx context.Context, env *testenv.Env, n int, logf func(string, ...any)) (*FunctionResult, error) {
	dir, err := buildBenchFunction()
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	res := &FunctionResult{Triggers: n}
	cfg := Config{Triggers: n}
	template := configMapWorkload(strings.NewReplacer("WORKERS", "", "RESYNC", `"0"`).Replace(rule))
	if res.TemplateSeconds, res.TemplateCPU, err = syncloopConverges(ctx, env, cfg, template, "bench-template"); err != nil {
		return nil, err
	}
	logf("function: %d children from a template in %.2fs, %.2f CPU s", n, res.TemplateSeconds, res.TemplateCPU)
	served := configMapWorkload(strings.Replace(functionRule, "SERVE", "true", 1))
	served.dir = dir
	if res.ServedSeconds, res.ServedCPU, err = syncloopConverges(ctx, env, cfg, served, "bench-served"); err != nil {
		return nil, err
	}
	logf("function: %d children from a served function in %.2fs, %.2f CPU s", n, res.ServedSeconds, res.ServedCPU)
	fresh := configMapWorkload(strings.Replace(functionRule, "SERVE", "false", 1))
	fresh.dir = dir
	if res.FreshSeconds, res.FreshCPU, err = syncloopConverges(ctx, env, cfg, fresh, "bench-fresh"); err != nil {
		return nil, err
	}
	logf("function: %d children from a function started per call in %.2fs, %.2f CPU s", n, res.FreshSeconds, res.FreshCPU)
	hook := httptest.NewServer(http.HandlerFunc(hookHandler))
	defer hook.Close()
	webhook := configMapWorkload(strings.Replace(webhookRule, "URL", hook.URL, 1))
	if res.WebhookSeconds, res.WebhookCPU, err = syncloopConverges(ctx, env, cfg, webhook, "bench-webhook"); err != nil {
		return nil, err
	}
	logf("function: %d children from a webhook in %.2fs, %.2f CPU s", n, res.WebhookSeconds, res.WebhookCPU)
	res.Ratio = res.ServedSeconds / res.TemplateSeconds
	return res, nil
}

// buildBenchFunction compiles bench/fn for WebAssembly into a directory
// of its own, as fn.wasm.
func buildBenchFunction() (string, error) {
	dir, err := os.MkdirTemp("", "bench-fn-")
	if err != nil {
		return "", err
	}
	src, err := benchSource("fn")
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, "fn.wasm"), ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("building bench/fn: %v\n%s", err, out)
	}
	return dir, nil
}

// benchSource finds bench/<name> from the working directory: the
// repository's root (go run ./bench) or bench itself (go test).
func benchSource(name string) (string, error) {
	for _, d := range []string{filepath.Join("bench", name), name} {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			return d, nil
		}
	}
	return "", fmt.Errorf("bench/%s not found from the working directory", name)
}

func reportFunction(r *FunctionResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s — a function's child, %d triggers\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), r.Triggers)
	fmt.Fprintf(&b, "syncloop's defaults, in process, from a cold start; one child per trigger, the same ConfigMap from a template and from a Go function compiled to WebAssembly (bench/fn).\n\n")
	fmt.Fprintf(&b, "| the child from | start → %d children | CPU s | per child |\n|---|---|---|---|\n", r.Triggers)
	for _, w := range []struct {
		name      string
		secs, cpu float64
	}{{"a template", r.TemplateSeconds, r.TemplateCPU}, {"a function, served", r.ServedSeconds, r.ServedCPU}, {"a function, started per call", r.FreshSeconds, r.FreshCPU},
		{"a webhook (HTTP, in the same process: CPU both sides')", r.WebhookSeconds, r.WebhookCPU}} {
		fmt.Fprintf(&b, "| %s | %.2f s | %.2f | %.2f ms CPU |\n", w.name, w.secs, w.cpu, 1000*w.cpu/float64(r.Triggers))
	}
	fmt.Fprintf(&b, "\nServed / template convergence: %.2f (target: at most 1.5).\n", r.Ratio)
	return b.String()
}
