package manager

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
)

// failingWrites fails the writes of ControllerRevisions while on, and
// their reads too while reads is, as a reset connection does.
type failingWrites struct {
	on, reads *atomic.Bool
	next      http.RoundTripper
}

func (f failingWrites) RoundTrip(r *http.Request) (*http.Response, error) {
	read := r.Method == http.MethodGet
	if (f.on.Load() && !read || f.reads.Load() && read) && strings.Contains(r.URL.Path, "/controllerrevisions") {
		return nil, errors.New("connection reset: injected")
	}
	return f.next.RoundTrip(r)
}

// TestUnrecordedRevisionOwed: a version put in force whose revision could
// not be recorded is recorded by a later keep even once its file is
// broken — a start then runs it, not the version before (the fault
// campaign found a restarted replica running a rule's older version for
// good: its recording had failed, and the file broke before the next
// load) — but not over a newer revision another replica recorded
// meanwhile, nor when its file broke before it was ever put in force.
func TestUnrecordedRevisionOwed(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	var failing, failingReads atomic.Bool
	cfg := env.Config()
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return failingWrites{on: &failing, reads: &failingReads, next: rt}
	})
	c, ns, l := keeperFixture(t, cfg, "owed-")
	other, err := NewClients(env.Config(), nil) // another replica's
	if err != nil {
		t.Fatal(err)
	}
	const file = "/rules/owed.yaml"
	version := func(gen int) *rules.Set { return ruleVersion(t, l, file, gen, time.Time{}) }
	brokenFile := map[string]bool{file: true}
	lastGoodGen := func(k *revisionKeeper) string { return lastGoodSource(t, k, l, file) }
	want := func(gen int) string { return string(version(gen).Get("owed").Source) }

	k := newRevisionKeeper(c, ns.Name, "")
	if k.keep(ctx, version(1), nil) {
		t.Fatal("recording generation 1 failed")
	}
	// keepFailing puts generation gen in force while the revisions'
	// writes fail: the keep must say so, or it is not tried again.
	keepFailing := func(gen int) {
		t.Helper()
		failing.Store(true)
		defer failing.Store(false)
		if !k.keep(ctx, version(gen), nil) {
			t.Fatalf("recording generation %d with its writes failing reports no failure: it would not be tried again", gen)
		}
	}
	keepFailing(2)
	if got := lastGoodGen(k); got != want(1) {
		t.Fatalf("before the retry, a start would run %s, want generation 1", got)
	}
	if k.keep(ctx, version(2), brokenFile) {
		t.Fatal("recording the owed generation 2, its file broken, failed")
	}
	if got := lastGoodGen(k); got != want(2) {
		t.Errorf("after the retry with the file broken, a start would run %s, want generation 2", got)
	}
	if len(k.failed()) != 0 {
		t.Errorf("failures still reported: %q", k.failed())
	}

	// Owed no longer once another replica recorded a newer version.
	keepFailing(3)
	if newRevisionKeeper(other, ns.Name, "").keep(ctx, version(4), nil) {
		t.Fatal("the other replica recording generation 4 failed")
	}
	if k.keep(ctx, version(3), brokenFile) {
		t.Fatal("keeping generation 3, its file broken, failed")
	}
	if got := lastGoodGen(k); got != want(4) {
		t.Errorf("generation 3 recorded over the other replica's newer 4: a start would run %s", got)
	}

	// Owed when the keep could not even list the revisions: the newest
	// it knew of is the one it had just recorded itself (the campaign
	// found a replica that took its own last recording for another's
	// newer one, and never recorded the version it ran).
	if k.keep(ctx, version(5), nil) {
		t.Fatal("recording generation 5 failed")
	}
	failingReads.Store(true)
	keepFailing(6)
	failingReads.Store(false)
	if k.keep(ctx, version(6), brokenFile) {
		t.Fatal("recording the owed generation 6, its file broken, failed")
	}
	if got := lastGoodGen(k); got != want(6) {
		t.Errorf("generation 6, unrecorded as its keep could not list, was not recorded once the file broke: a start would run %s", got)
	}

	// Never owed: a broken file's version that was recorded is not
	// recorded again over a newer one.
	if k.keep(ctx, version(2), brokenFile) {
		t.Fatal("keeping generation 2, its file broken, failed")
	}
	if got := lastGoodGen(k); got != want(6) {
		t.Errorf("a broken file's older version renumbered newest: a start would run %s", got)
	}
}

// TestOlderVersionRecordedLate: a replica's recording of a file's version
// that comes in after another replica recorded the file's next version —
// read later — does not make the older the newest (the fault campaign
// found a recording slowed by the API server landing after the next
// version's, and every replica running the version before for good once
// the file broke); the same version read again later (a change
// undone) does.
func TestOlderVersionRecordedLate(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	c, ns, l := keeperFixture(t, env.Config(), "late-")
	const file = "/rules/late.yaml"
	t0 := time.Now()
	version := func(gen, second int) *rules.Set {
		return ruleVersion(t, l, file, gen, t0.Add(time.Duration(second)*time.Second))
	}
	want := func(gen int) string { return string(version(gen, 0).Get("owed").Source) }
	fast, slow := newRevisionKeeper(c, ns.Name, ""), newRevisionKeeper(c, ns.Name, "")
	if fast.keep(ctx, version(1, 1), nil) {
		t.Fatal("recording generation 1 failed")
	}
	if fast.keep(ctx, version(2, 2), nil) || slow.keep(ctx, version(1, 1), nil) {
		t.Fatal("recording failed")
	}
	if got := lastGoodSource(t, slow, l, file); got != want(2) {
		t.Errorf("generation 1, recorded after generation 2 that was read later, made the newest: a start would run %s", got)
	}
	if slow.keep(ctx, version(1, 3), nil) {
		t.Fatal("recording generation 1 again failed")
	}
	if got := lastGoodSource(t, fast, l, file); got != want(1) {
		t.Errorf("generation 1 read again after 2 is not the newest: a start would run %s", got)
	}
}

// ruleVersion is generation gen of rule owed, in file, first read at
// loaded (zero: not known).
func ruleVersion(t *testing.T, l *rules.Loader, file string, gen int, loaded time.Time) *rules.Set {
	t.Helper()
	f, err := l.Parse(file, fmt.Appendf(nil, `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: owed}
spec:
  watch: {apiVersion: v1, kind: Namespace}
  resources:
    - {id: cm, template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: default}, data: {gen: "%d"}}}
`, gen))
	if err != nil {
		t.Fatal(err)
	}
	f.LoadedAt = loaded
	set, err := rules.NewSet(f)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// lastGoodSource is the source of the one rule a start with file broken
// runs, as k's revisions say.
func lastGoodSource(t *testing.T, k *revisionKeeper, l *rules.Loader, file string) string {
	t.Helper()
	f, err := k.lastGood(l)(file, nil)
	if err != nil || f == nil || len(f.Rules) != 1 {
		t.Fatalf("last good version: %v, %v", f, err)
	}
	return string(f.Rules[0].Source)
}
