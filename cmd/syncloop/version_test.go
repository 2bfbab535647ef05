package main

import (
	"bytes"
	"runtime"
	"runtime/debug"
	"testing"
)

func TestVersionString(t *testing.T) {
	deps := []*debug.Module{{Path: "k8s.io/client-go", Version: "v0.37.2"}}
	goV := runtime.Version()
	tests := []struct {
		name    string
		ldflags string
		bi      *debug.BuildInfo
		want    string
	}{
		{"ldflags win", "v1.2.3", &debug.BuildInfo{Main: debug.Module{Version: "v0.9.0"}, Deps: deps},
			"syncloop v1.2.3 (" + goV + ", client-go v0.37.2)"},
		{"module version", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.9.0"}, Deps: deps},
			"syncloop v0.9.0 (" + goV + ", client-go v0.37.2)"},
		{"devel build", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Deps: deps},
			"syncloop dev (" + goV + ", client-go v0.37.2)"},
		{"no build info", "", nil, "syncloop dev (" + goV + ", client-go unknown)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := versionString(tt.ldflags, tt.bi); got != tt.want {
				t.Errorf("versionString() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestVersionCommand(t *testing.T) {
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"version"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(out.Bytes(), []byte("syncloop ")) || !bytes.Contains(out.Bytes(), []byte(runtime.Version())) {
		t.Errorf("version printed %q", out.String())
	}
	root.SetArgs([]string{"version", "extra"})
	if err := root.Execute(); err == nil {
		t.Error("version with an argument succeeded, want an error")
	}
}
