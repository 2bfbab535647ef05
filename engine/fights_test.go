package engine

import (
	"context"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules/render"
)

// TestFightDecisions: repairs go ahead until Repairs of them fall within
// Window; then none for Cooling, which doubles while the fight goes on, up
// to MaxCooling, and starts over after a window of peace.
func TestFightDecisions(t *testing.T) {
	f := newFights(FightPolicy{Repairs: 3, Window: 10 * time.Second, Cooling: 2 * time.Second, MaxCooling: 5 * time.Second})
	ref := childRef{gvk: schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, namespace: "ns", name: "x"}
	t0 := time.Unix(1_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	step := func(d time.Duration, wantOK, wantStarted bool, wantUntil time.Duration) {
		t.Helper()
		ok, started, until, _ := f.repair(ref, at(d))
		if ok != wantOK || started != wantStarted || (!ok && !until.Equal(at(wantUntil))) {
			t.Errorf("at %v: ok %v started %v until %v; want %v %v %v", d, ok, started, until.Sub(t0), wantOK, wantStarted, wantUntil)
		}
	}
	step(0, true, false, 0)
	step(1*time.Second, true, false, 0)
	step(2*time.Second, true, false, 0)
	step(3*time.Second, false, true, 5*time.Second)  // the fourth within the window: cooling 2 s
	step(4*time.Second, false, false, 5*time.Second) // cooling
	step(5*time.Second, true, false, 0)              // cooled: repairs again
	step(6*time.Second, true, false, 0)
	step(7*time.Second, true, false, 0)
	step(8*time.Second, false, true, 12*time.Second)  // the fight goes on: 4 s
	step(13*time.Second, true, false, 0)              // cooled
	step(14*time.Second, true, false, 0)              //
	step(15*time.Second, true, false, 0)              //
	step(16*time.Second, false, true, 21*time.Second) // capped at 5 s
	step(40*time.Second, true, false, 0)              // peace for a window: over
	step(41*time.Second, true, false, 0)
	step(42*time.Second, true, false, 0)
	step(43*time.Second, false, true, 45*time.Second) // a new fight: 2 s again
	f.gone(ref)
	if len(f.m) != 0 {
		t.Errorf("%d fights left after the child went", len(f.m))
	}
}

// TestDrifted: the fields a child's desired content sets that the live
// object holds other values of, by path; lists compared whole.
func TestDrifted(t *testing.T) {
	desired := map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "x", "labels": map[string]any{"a": "1", "b": "2"}},
		"data":     map[string]any{"k": "v", "same": "s"},
		"spec":     map[string]any{"list": []any{"a", "b"}, "n": int64(1)}}
	live := map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "x", "labels": map[string]any{"a": "1", "b": "changed"}, "uid": "u"},
		"data":     map[string]any{"k": "other", "same": "s", "extra": "e"},
		"spec":     map[string]any{"list": []any{"a"}, "n": float64(1)}}
	want := []string{".data.k", ".metadata.labels.b", ".spec.list"}
	if got := drifted(desired, live, ""); !reflect.DeepEqual(got, want) {
		t.Errorf("drifted = %v, want %v", got, want)
	}
}

// TestFight: another writer flipping a field of a child every 100 ms is a
// fight: after a handful of repairs syncloop leaves the child alone for a
// cooling period, says so — a Contended Warning Event naming the writer
// and the field, Ready False with reason Contended — and counts each
// repair by the writer's manager. Repairs stay a handful per cooling
// period, not one per flip; once the writer stops the child is repaired
// and the trigger is Ready again.
//
// API server: another writer's field manager flipping a field, and
// managedFields telling who.
func TestFight(t *testing.T) {
	h := newHarness(t)
	h.installWidgets()
	m := &recordingMetrics{}
	h.metrics = m
	h.fights = FightPolicy{Repairs: 3, Window: 20 * time.Second, Cooling: 2 * time.Second, MaxCooling: 4 * time.Second}
	h.start(h.loadRules(guardedRule))
	h.createWidget("w", map[string]any{"size": int64(3)})
	h.eventually("Ready", func() bool { c := readyCondition(h.widget("w")); return c != nil && c["status"] == "True" })

	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	flips := 0
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			cm, err := h.cs.CoreV1().ConfigMaps(h.ns).Get(ctx, "w-cfg", metav1.GetOptions{})
			if err != nil {
				continue
			}
			cm.Data["size"] = map[bool]string{true: "98", false: "99"}[cm.Data["size"] == "99"]
			if _, err := h.cs.CoreV1().ConfigMaps(h.ns).Update(ctx, cm, metav1.UpdateOptions{FieldManager: "fighter"}); err == nil {
				flips++
			}
		}
	})
	defer func() { stop(); wg.Wait() }()
	repairs := func(r testenv.Request) bool {
		return r.Method == http.MethodPatch && strings.HasSuffix(r.Path, "/configmaps/w-cfg")
	}
	before := len(h.counter.Requests(repairs))
	h.waitForEventWithin(30*time.Second, render.ReasonContended, "w", `field manager "fighter" keeps changing .data.size`)
	h.eventually("Ready False, Contended", func() bool {
		c := readyCondition(h.widget("w"))
		return c != nil && c["status"] == "False" && c["reason"] == render.ReasonContended && strings.Contains(c["message"].(string), `"fighter"`)
	})
	fightStart := time.Now()
	h.eventuallyWithin(time.Minute, "the fight to go on for 8 s", func() bool { return time.Since(fightStart) > 8*time.Second })
	stop()
	wg.Wait()
	made := len(h.counter.Requests(repairs)) - before
	// Coolings of 2 s, 4 s, 4 s…: from the first Contended Event to the
	// writer's end, at most four coolings began, each after at most 3
	// repairs; a repair per flip would be dozens.
	if made > 15 || flips < 40 {
		t.Errorf("%d repairs for %d flips: want a handful per cooling period (at most 15), and the writer to have flipped often", made, flips)
	}
	if n := m.repaired("guarded", "fighter"); n == 0 {
		t.Error(`syncloop_drift_repairs_total{manager="fighter"} = 0`)
	}
	h.eventually("the child repaired once the writer stopped", func() bool {
		cm, ok := h.configMap(h.ns, "w-cfg")
		return ok && cm.Data["size"] == "3"
	})
	h.eventually("Ready again", func() bool { c := readyCondition(h.widget("w")); return c != nil && c["status"] == "True" })
	if failed := h.events("Failed"); len(failed) > 0 {
		t.Errorf("a fight is not a failure: %d Failed Events, the first: %s", len(failed), failed[0].Message)
	}
}
