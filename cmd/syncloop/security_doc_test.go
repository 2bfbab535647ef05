package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSecurityDocNamesTests: every row of docs/security.md's tables — one
// input surface each — names at least one test or fuzz target, and every
// one it names exists, so the threat model cannot point at a test that
// was renamed or never written.
func TestSecurityDocNamesTests(t *testing.T) {
	data, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	funcs := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz)\w+)\(`)
	err = filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range funcs.FindAllStringSubmatch(string(src), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile("`((?:Test|Fuzz)\\w+)`")
	rows := 0
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| surface ") || strings.HasPrefix(line, "|---") {
			continue
		}
		rows++
		surface, _, _ := strings.Cut(strings.TrimPrefix(line, "| "), " |")
		tests := named.FindAllStringSubmatch(line, -1)
		if len(tests) == 0 {
			t.Errorf("docs/security.md: the row of %q names no test", surface)
		}
		for _, m := range tests {
			if !defined[m[1]] {
				t.Errorf("docs/security.md: the row of %q names %s, which no test file defines", surface, m[1])
			}
		}
	}
	if rows < 20 {
		t.Errorf("docs/security.md has %d rows: its tables were not read", rows)
	}
}
