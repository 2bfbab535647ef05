// Command hook is a sync hook server written to Metacontroller's
// CompositeController protocol alone — the standard library, nothing of
// syncloop — as a team moving from Metacontroller has one: for each
// HelloWorld, a Pod that greets spec.who — with the greeting of the
// ConfigMap greetings in its namespace, which its customize hook asks to
// be given — and as status how many of its Pods exist and how many
// succeeded. syncloop calls it unchanged (examples/hello-hook/rules.yaml).
package main

import (
	"encoding/json"
	"flag"
	"log"
	"net/http"
)

// object is what the hook reads of a Kubernetes object.
type object struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Who string `json:"who"`
	} `json:"spec"`
	Status struct {
		Phase string `json:"phase"`
	} `json:"status"`
	Data map[string]string `json:"data"`
}

// request is the sync hook's request: the parent, and its children and
// related objects by kind ("Pod.v1") then name.
type request struct {
	Parent   object                       `json:"parent"`
	Children map[string]map[string]object `json:"children"`
	Related  map[string]map[string]object `json:"related"`
}

// customize answers the customize hook: the parent is to be given the
// ConfigMap greetings of its namespace.
func customize(object) map[string]any {
	return map[string]any{"relatedResources": []any{
		map[string]any{"apiVersion": "v1", "resource": "configmaps", "names": []string{"greetings"}},
	}}
}

// response is the sync hook's response.
type response struct {
	Status   map[string]any `json:"status"`
	Children []any          `json:"children"`
}

func sync(req request) response {
	succeeded := 0
	for _, pod := range req.Children["Pod.v1"] {
		if pod.Status.Phase == "Succeeded" {
			succeeded++
		}
	}
	who := req.Parent.Spec.Who
	if who == "" {
		who = "World"
	}
	greeting := req.Related["ConfigMap.v1"]["greetings"].Data["greeting"]
	if greeting == "" {
		greeting = "Hello"
	}
	pod := map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   map[string]any{"name": req.Parent.Metadata.Name},
		"spec": map[string]any{
			"restartPolicy": "OnFailure",
			"containers": []any{map[string]any{
				"name": "hello", "image": "busybox", "command": []any{"echo", greeting + ", " + who + "!"},
			}},
		},
	}
	return response{
		Status:   map[string]any{"replicas": len(req.Children["Pod.v1"]), "succeeded": succeeded},
		Children: []any{pod},
	}
}

// serve handles a hook: the request decoded as In, the answer of f.
func serve[In, Out any](f func(In) Out) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req In
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(f(req)); err != nil {
			log.Print(err)
		}
	}
}

func main() {
	addr := flag.String("addr", ":8080", "address to listen on")
	flag.Parse()
	http.HandleFunc("/sync", serve(sync))
	http.HandleFunc("/customize", serve(func(req struct {
		Parent object `json:"parent"`
	}) map[string]any {
		return customize(req.Parent)
	}))
	log.Fatal(http.ListenAndServe(*addr, nil))
}
