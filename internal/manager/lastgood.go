package manager

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/syncloop/syncloop/rules"
)

// revisionSource begins the name a rule compiled from a revision is
// parsed under: "revision <name>".
const revisionSource = "revision "

// lastGoodTimeout bounds the read of the revisions a start recovers a
// broken file's last good version from.
const lastGoodTimeout = 30 * time.Second

// lastGood is reload.Source's UseLastGood: the version of a broken rule
// file the rules' revisions say was last in force — for each rule whose
// newest revision came from path (rules.AnnotationSourceFile), that
// revision, compiled as the loader compiles the file (as a tenant rule
// for a tenant ConfigMap's). A syncloop restarted while a file is broken,
// or a new replica started then, so runs what ran before instead of
// nothing; and a replica whose own last good version is older than the
// one the others recorded (it loaded the file before they loaded its
// next version, then the file broke) runs theirs, so that replicas do not
// run two versions of a rule, nor fight over which revision is newest.
// current, this process's version, is kept when the revisions do not
// know it (its revision not recorded: which is newer cannot be told) or
// when it is theirs. nil when no revision came from path and there is no
// current (recorded before the annotation existed, or never).
func (k *revisionKeeper) lastGood(l *rules.Loader) func(path string, current *rules.File) (*rules.File, error) {
	return func(path string, current *rules.File) (*rules.File, error) {
		ctx, cancel := context.WithTimeout(context.Background(), lastGoodTimeout)
		defer cancel()
		all, err := k.store.List(ctx, k.selector())
		if err != nil {
			return nil, &rules.Retryable{Err: fmt.Errorf("reading the rules' revisions: %w", err)}
		}
		newest := newestMarked(all, path)
		if current != nil && !supersededBy(current, all, newest) {
			return current, nil
		}
		loader := l
		if ns, ok := tenantConfigMap(path); ok {
			if loader, err = l.ForTenant(ns.Namespace); err != nil {
				return nil, err
			}
		}
		f := &rules.File{Path: path}
		f.LoadedAt, _ = newestLoaded(newest)
		for _, cr := range newest {
			parsed, err := loader.Parse(revisionSource+cr.Name, cr.Data.Raw)
			if err != nil || len(parsed.Rules) != 1 {
				continue // a revision that no longer compiles (a kind gone): not a version to run
			}
			f.Rules = append(f.Rules, parsed.Rules[0])
		}
		if len(f.Rules) == 0 && current == nil {
			return nil, nil
		}
		sort.Slice(f.Rules, func(i, j int) bool { return f.Rules[i].Name < f.Rules[j].Name })
		return f, nil
	}
}

// newestMarked are, of each rule's revisions among all, the newest if it
// came from path, by rule.
func newestMarked(all []appsv1.ControllerRevision, path string) map[string]appsv1.ControllerRevision {
	newest := map[string]appsv1.ControllerRevision{}
	for _, cr := range all {
		r := cr.Labels[rules.LabelRule]
		if n, ok := newest[r]; !ok || newerRevision(cr, n) {
			newest[r] = cr
		}
	}
	for r, cr := range newest {
		if cr.Annotations[rules.AnnotationSourceFile] != path {
			delete(newest, r)
		}
	}
	return newest
}

// supersededBy reports whether the revisions all say that a newer version
// of current's file than current was in force. When it is known when
// both were loaded (File.LoadedAt, rules.AnnotationLoadedAt), the one
// loaded later is newer. Otherwise: each of current's rules is
// recorded (else which is newer cannot be told), and the file's newest
// revisions (newest, newestMarked's) are not current's rules — a rule of
// current no longer the newest or no longer from the file, or one the
// file gained. Versions are compared by their source, not their hash: a
// hash holds the schemas the rule was compiled against, which a replica
// that fetched them at another moment may see otherwise.
func supersededBy(current *rules.File, all []appsv1.ControllerRevision, newest map[string]appsv1.ControllerRevision) bool {
	if loaded, ok := newestLoaded(newest); ok && !current.LoadedAt.IsZero() && !loaded.Equal(current.LoadedAt) {
		return loaded.After(current.LoadedAt)
	}
	same := len(newest) == len(current.Rules)
	for _, r := range current.Rules {
		recorded := false
		for _, cr := range all {
			recorded = recorded || cr.Labels[rules.LabelRule] == r.Name && sameSource(cr, r)
		}
		if !recorded {
			return false
		}
		n, ok := newest[r.Name]
		same = same && ok && sameSource(n, r)
	}
	return !same
}

// newestLoaded is when the newest of newest (newestMarked's) were
// loaded: the latest of their times; false when one was not recorded,
// or there are none.
func newestLoaded(newest map[string]appsv1.ControllerRevision) (time.Time, bool) {
	var latest time.Time
	for _, cr := range newest {
		t := loadedAt(cr)
		if t.IsZero() {
			return time.Time{}, false
		}
		if t.After(latest) {
			latest = t
		}
	}
	return latest, !latest.IsZero()
}

// sameSource reports whether cr records r's source.
func sameSource(cr appsv1.ControllerRevision, r *rules.Rule) bool {
	var v any
	if json.Unmarshal(cr.Data.Raw, &v) != nil {
		return false
	}
	canonical, err := json.Marshal(v)
	return err == nil && bytes.Equal(canonical, r.Source)
}

// sources keeps AnnotationSourceFile true of each rule's newest revision
// (byRule, as keep listed them) for lastGood: a rule of set that moved to
// another file is marked with its file, and a rule removed from a file
// set holds loses its mark, so that a restart with that file broken does
// not bring back a rule its author removed. A mark naming a file set
// does not hold is left: no lastGood of this process asks for it (another
// rules directory's, or a file deleted). A rule missing from set because
// its file has no version in force (broken, false) is not removed, only not
// loaded: its mark stays. A rule put in force from a revision keeps its
// mark. broken are the files that do not load (true: a last good version
// in force).
func (k *revisionKeeper) sources(ctx context.Context, set *rules.Set, byRule map[string][]appsv1.ControllerRevision, broken map[string]bool) error {
	held := map[string]bool{}
	for _, f := range set.Files() {
		held[f.Path] = true
	}
	for rule, revs := range byRule {
		if len(revs) == 0 {
			continue
		}
		newest := revs[0]
		for _, cr := range revs {
			if newerRevision(cr, newest) {
				newest = cr
			}
		}
		marked := newest.Annotations[rules.AnnotationSourceFile]
		want := ""
		if r := set.Get(rule); r != nil {
			if want = r.Pos.File; strings.HasPrefix(want, revisionSource) || r.Hash != newest.Annotations[rules.AnnotationRuleHash] {
				continue // recovered, or its revision just recorded with the mark
			}
		} else if lastGood, ok := broken[marked]; !held[marked] || ok && !lastGood {
			continue
		}
		if marked == want {
			continue
		}
		if _, err := k.store.Annotate(ctx, newest.Name, rules.AnnotationSourceFile, want); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}
