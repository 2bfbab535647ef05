package rules

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func ruleDoc(name string) string {
	return strings.Replace(head, "name: r", "name: "+name, 1) + watchNS + cm
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestConfigMapVolumeLayout lays out a directory as kubelet does for a
// ConfigMap volume: the files live in a timestamped directory, "..data"
// links to it, and the visible names link into "..data".
func TestConfigMapVolumeLayout(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "..2026_11_29_10_00_00.123", "tenant.yaml"), ruleDoc("tenant"))
	write(t, filepath.Join(dir, "..2026_11_29_10_00_00.123", "copy.yml"), ruleDoc("copy"))
	if err := os.Symlink("..2026_11_29_10_00_00.123", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tenant.yaml", "copy.yml"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	files, err := FindFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "copy.yml"), filepath.Join(dir, "tenant.yaml")}
	if strings.Join(files, ",") != strings.Join(want, ",") {
		t.Fatalf("FindFiles = %v, want %v (each rule file once, through its visible symlink)", files, want)
	}
	set, err := newLoader(t).Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if set.Len() != 2 || set.Get("tenant") == nil || set.Get("copy") == nil {
		t.Errorf("loaded %d rules, want tenant and copy", set.Len())
	}
}

func TestFindFiles(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), "")
	write(t, filepath.Join(dir, "sub", "b.yml"), "")
	write(t, filepath.Join(dir, ".hidden.yaml"), "")
	write(t, filepath.Join(dir, ".git", "c.yaml"), "")
	write(t, filepath.Join(dir, "notes.txt"), "")
	write(t, filepath.Join(dir, "README.md"), "")
	if err := os.Symlink(dir, filepath.Join(dir, "sub", "loop")); err != nil { // a cycle
		t.Fatal(err)
	}
	if err := os.Symlink("missing.yaml", filepath.Join(dir, "dangling.yaml")); err != nil {
		t.Fatal(err)
	}
	files, err := FindFiles(dir, filepath.Join(dir, "notes.txt"))
	if err != nil {
		t.Fatal(err)
	}
	got := make([]string, len(files))
	for i, f := range files {
		got[i], _ = filepath.Rel(dir, f)
	}
	if want := "a.yaml,sub/b.yml,notes.txt"; strings.Join(got, ",") != want {
		t.Errorf("FindFiles = %v, want %s", got, want)
	}
	if _, err := FindFiles(filepath.Join(dir, "nope")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing path: err = %v, want ErrNotExist", err)
	}
}

func TestDuplicateNamesAcrossFiles(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), ruleDoc("same"))
	write(t, filepath.Join(dir, "b.yaml"), "# a comment\n"+ruleDoc("same"))
	_, err := newLoader(t).Load(dir)
	want := filepath.Join(dir, "b.yaml") + `:2:1: rule "same": metadata.name: rule name used twice: also at ` + filepath.Join(dir, "a.yaml") + ":1:1"
	if err == nil || err.Error() != want {
		t.Errorf("err = %v\nwant %s", err, want)
	}
}

func TestNonRuleDocumentsSkipped(t *testing.T) {
	doc := "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n" + ruleDoc("r") +
		"---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: x}\n---\n"
	f, err := newLoader(t).Parse("mixed.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Rules) != 1 || f.Skipped != 2 {
		t.Errorf("rules %d, skipped %d; want 1 and 2", len(f.Rules), f.Skipped)
	}
	// A document that means to be a rule but misspells its kind is not skipped.
	_, err = newLoader(t).Parse("typo.yaml", []byte("apiVersion: syncloop.dev/v1alpha1\nkind: Rul\nmetadata: {name: r}\nspec: {}\n"))
	if err == nil || !strings.Contains(err.Error(), `kind: must be Rule, not "Rul"`) {
		t.Errorf("err = %v, want the misspelt kind reported", err)
	}
}

func TestOneBadRuleFailsItsFile(t *testing.T) {
	doc := ruleDoc("good") + "---\n" + strings.Replace(ruleDoc("bad"), "kind: Namespace", "kind: ${x}", 1)
	if _, err := newLoader(t).Parse("f.yaml", []byte(doc)); err == nil {
		t.Fatal("a file with one bad rule parsed")
	}
}

func TestHash(t *testing.T) {
	l := newLoader(t)
	hash := func(doc string) string {
		t.Helper()
		f, err := l.Parse("h.yaml", []byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		return f.Rules[0].Hash
	}
	base := hash(ruleDoc("h"))
	if len(base) != 64 {
		t.Fatalf("hash %q is not a sha256", base)
	}
	if got := hash("# moved and commented\n\n" + ruleDoc("h")); got != base {
		t.Error("comments and blank lines changed the hash")
	}
	if got := hash(strings.Replace(ruleDoc("h"), "metadata: {name: x}", "metadata:\n          name: x", 1)); got != base {
		t.Error("flow vs block style changed the hash")
	}
	if got := hash(strings.Replace(ruleDoc("h"), "name: x", "name: y", 1)); got == base {
		t.Error("a changed template kept the hash")
	}
	if got := hash(ruleDoc("h") + "  workers: 3\n"); got == base {
		t.Error("a changed worker count kept the hash")
	}
}

func TestHugeDocumentsBounded(t *testing.T) {
	// A "billion laughs": each level doubles ten times over.
	var b strings.Builder
	b.WriteString(head + watchNS + cm + "  status:\n    a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 9; i++ {
		b.WriteString("    a" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [")
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("*a" + string(rune('0'+i-1)))
		}
		b.WriteString("]\n")
	}
	_, err := newLoader(t).Parse("laughs.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "document too large") {
		t.Fatalf("err = %v, want 'document too large'", err)
	}
	big := strings.Repeat("#", maxFileSize+1)
	if _, err := newLoader(t).Parse("big.yaml", []byte(big)); err == nil || !strings.Contains(err.Error(), "file too large") {
		t.Fatalf("err = %v, want 'file too large'", err)
	}
}

func TestRecursiveAndDeepDocuments(t *testing.T) {
	l := newLoader(t)
	_, err := l.Parse("loop.yaml", []byte(head+watchNS+cm+"  status:\n    a: &a [x, *a]\n"))
	if err == nil || !strings.Contains(err.Error(), "alias *a refers to a value that contains it") {
		t.Errorf("self-referencing alias: err = %v", err)
	}
	deep := head + watchNS + cm + "  status:\n    a: " + strings.Repeat("[", 150) + strings.Repeat("]", 150) + "\n"
	_, err = l.Parse("deep.yaml", []byte(deep))
	if err == nil || !strings.Contains(err.Error(), "nested more than 100 levels deep") {
		t.Errorf("deep nesting: err = %v", err)
	}
	// An alias used twice, not inside itself, is fine.
	ok := head + watchNS + cm + "        data: {a: &a y, b: *a}\n"
	if _, err := l.Parse("ok.yaml", []byte(ok)); err != nil {
		t.Errorf("alias used twice: %v", err)
	}
}

// TestThousandRuleFiles: 1,000 rule files in a directory load, each rule
// in force, and what they hold is bounded per rule (measured: 4.4 KB
// each for a rule of one resource).
func TestThousandRuleFiles(t *testing.T) {
	dir := t.TempDir()
	for i := range 1000 {
		doc := fmt.Sprintf("apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: r%04d\nspec:\n", i) + watchNS + cm
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("r%04d.yaml", i)), []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	l := newLoader(t)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	set, err := l.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if set.Len() != 1000 {
		t.Fatalf("%d rules in force, want 1,000", set.Len())
	}
	perRule := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / 1000
	t.Logf("%d bytes held per rule", perRule)
	if perRule > 64<<10 {
		t.Errorf("%d bytes held per rule: more than 64 KiB", perRule)
	}
	runtime.KeepAlive(set)
}
