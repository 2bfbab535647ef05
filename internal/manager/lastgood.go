package manager

import (
	"context"
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

// lastGood is reload.Source's UseLastGood: the version of a rule file an
// earlier process ran — for each rule whose newest revision came from
// path (rules.AnnotationSourceFile), that revision, compiled as the
// loader compiles the file (as a tenant rule for a tenant ConfigMap's).
// A syncloop restarted while a file is broken, or a new replica started
// then, so runs what ran before instead of nothing, as a process that
// had loaded the file keeps its last good version. nil when no revision
// came from path (recorded before the annotation existed, or never).
func (k *revisionKeeper) lastGood(l *rules.Loader) func(path string) (*rules.File, error) {
	return func(path string) (*rules.File, error) {
		ctx, cancel := context.WithTimeout(context.Background(), lastGoodTimeout)
		defer cancel()
		all, err := k.store.List(ctx, k.selector())
		if err != nil {
			return nil, &rules.Retryable{Err: fmt.Errorf("reading the rules' revisions: %w", err)}
		}
		newest := map[string]int{} // rule → index in all
		for i, cr := range all {
			r := cr.Labels[rules.LabelRule]
			if j, ok := newest[r]; !ok || cr.Revision > all[j].Revision {
				newest[r] = i
			}
		}
		loader := l
		if ns, ok := tenantConfigMap(path); ok {
			if loader, err = l.ForTenant(ns.Namespace); err != nil {
				return nil, err
			}
		}
		f := &rules.File{Path: path}
		for _, i := range newest {
			cr := all[i]
			if cr.Annotations[rules.AnnotationSourceFile] != path {
				continue
			}
			parsed, err := loader.Parse(revisionSource+cr.Name, cr.Data.Raw)
			if err != nil || len(parsed.Rules) != 1 {
				continue // a revision that no longer compiles (a kind gone): not a version to run
			}
			f.Rules = append(f.Rules, parsed.Rules[0])
		}
		if len(f.Rules) == 0 {
			return nil, nil
		}
		sort.Slice(f.Rules, func(i, j int) bool { return f.Rules[i].Name < f.Rules[j].Name })
		return f, nil
	}
}

// sources keeps AnnotationSourceFile true of each rule's newest revision
// (byRule, as keep listed them) for lastGood: a rule of set that moved to
// another file is marked with its file, and a rule removed from a file
// set holds loses its mark, so that a restart with that file broken does
// not bring back a rule its author removed. A mark naming a file set
// does not hold is left: no lastGood of this process asks for it (another
// rules directory's, or a file deleted). A rule missing from set because
// its file has no version in force (unloaded) is not removed, only not
// loaded: its mark stays. A rule put in force from a revision keeps its
// mark.
func (k *revisionKeeper) sources(ctx context.Context, set *rules.Set, byRule map[string][]appsv1.ControllerRevision, unloaded map[string]bool) error {
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
			if cr.Revision > newest.Revision {
				newest = cr
			}
		}
		marked := newest.Annotations[rules.AnnotationSourceFile]
		want := ""
		if r := set.Get(rule); r != nil {
			if want = r.Pos.File; strings.HasPrefix(want, revisionSource) || r.Hash != newest.Annotations[rules.AnnotationRuleHash] {
				continue // recovered, or its revision just recorded with the mark
			}
		} else if !held[marked] || unloaded[marked] {
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
