package engine

import "testing"

func TestHolds(t *testing.T) {
	live := map[string]any{
		"metadata": map[string]any{"name": "a", "labels": map[string]any{"x": "1", "extra": "y"}, "resourceVersion": "7"},
		"spec": map[string]any{
			"replicas": int64(3), "ratio": 0.5, "on": true, "none": nil,
			"containers": []any{map[string]any{"name": "app", "image": "nginx", "terminationMessagePath": "/dev/x"}},
		},
	}
	tests := []struct {
		name    string
		desired any
		want    bool
	}{
		{"subset of maps", map[string]any{"metadata": map[string]any{"labels": map[string]any{"x": "1"}}}, true},
		{"defaulted fields in list items", map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "app", "image": "nginx"}}}}, true},
		{"int equals float", map[string]any{"spec": map[string]any{"replicas": 3.0, "ratio": 0.5}}, true},
		{"bool and null", map[string]any{"spec": map[string]any{"on": true, "none": nil}}, true},
		{"changed value", map[string]any{"metadata": map[string]any{"labels": map[string]any{"x": "2"}}}, false},
		{"missing key", map[string]any{"spec": map[string]any{"paused": true}}, false},
		{"list length", map[string]any{"spec": map[string]any{"containers": []any{}}}, false},
		{"list item differs", map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"image": "httpd"}}}}, false},
		{"type differs", map[string]any{"spec": map[string]any{"replicas": "3"}}, false},
		{"int differs", map[string]any{"spec": map[string]any{"replicas": int64(4)}}, false},
		{"map where scalar", map[string]any{"metadata": map[string]any{"name": map[string]any{}}}, false},
	}
	for _, tt := range tests {
		if got := holds(live, tt.desired); got != tt.want {
			t.Errorf("%s: holds = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestContentHash(t *testing.T) {
	a := map[string]any{"data": map[string]any{"k": "v", "j": "w"}}
	b := map[string]any{"data": map[string]any{"j": "w", "k": "v"}}
	if contentHash(a) != contentHash(b) || len(contentHash(a)) != 16 {
		t.Errorf("hash depends on map order or has the wrong length: %s %s", contentHash(a), contentHash(b))
	}
	c := map[string]any{"data": map[string]any{"k": "v"}}
	if contentHash(a) == contentHash(c) {
		t.Error("removing a field kept the hash")
	}
}
