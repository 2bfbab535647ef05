package testenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Revision is syncloop as an earlier commit of this repository had it,
// built: for tests of upgrades from it.
type Revision struct {
	// Source is the commit's tree (charts/, examples/, …).
	Source string
	// Binary is its syncloop, built from Source.
	Binary string
}

// BuildRevision extracts commit's tree from the repository the working
// directory is in (git archive) and builds its syncloop, both kept in the
// cache folder (syncloop-<commit>) so that a second run costs nothing. It
// needs git and the commit in the repository's history.
func BuildRevision(ctx context.Context, commit string) (*Revision, error) {
	dir := filepath.Join(defaultCacheRoot(), "syncloop-"+commit)
	rev := &Revision{Source: filepath.Join(dir, "src"), Binary: filepath.Join(dir, "syncloop")}
	if fi, err := os.Stat(rev.Binary); err == nil && fi.Mode()&0o111 != 0 {
		return rev, nil
	}
	top, err := gitOutput(ctx, "", "rev-parse", "--show-toplevel")
	if err != nil {
		return nil, err
	}
	if _, err := gitOutput(ctx, top, "cat-file", "-e", commit+"^{commit}"); err != nil {
		return nil, fmt.Errorf("commit %s is not in the repository's history (a shallow clone?): %w", commit, err)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".syncloop-"+commit+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp) // gone already once renamed
	src := filepath.Join(tmp, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		return nil, err
	}
	archive := exec.CommandContext(ctx, "sh", "-c", "git -C \"$1\" archive \"$2\" | tar -x -C \"$3\"", "sh", top, commit, src)
	if out, err := archive.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("extracting %s: %v: %s", commit, err, out)
	}
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", filepath.Join(tmp, "syncloop"), "./cmd/syncloop")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building syncloop at %s: %v: %s", commit, err, out)
	}
	// Whole or not at all: a run stopped half-way leaves nothing.
	_ = os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return nil, err
	}
	return rev, nil
}

func gitOutput(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, errOut.String())
	}
	return strings.TrimSpace(out.String()), nil
}
