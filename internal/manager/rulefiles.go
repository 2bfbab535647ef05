package manager

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/internal/metrics"
	"github.com/syncloop/syncloop/internal/panics"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
	"github.com/syncloop/syncloop/rules/reload"
)

// ruleFiles are the rules in force: every file that loads; a broken file
// is reported and, while syncloop runs, keeps its last good version. Rules
// are typed by the cluster's schemas and checked again when a CRD of a
// group they use changes. The newest set waits in updates for the engine;
// a standby keeps current for when it starts leading.
type ruleFiles struct {
	src       *reload.Source
	watcher   *reload.Watcher
	clients   *Clients
	metrics   *metrics.Metrics
	files     *fileErrors
	current   *currentSet
	updates   chan *rules.Set // the newest set not yet applied by the engine
	installed sync.Map        // groups of the CRDs there at start
	crds      *crdKeeper
	revisions *revisionKeeper
	announcer *announcer // Events on the rules ConfigMap; nil: none
	tenants   *tenants   // --tenant-rules: the teams' ConfigMaps; nil: none
	// conversions convert the kinds of every set loaded, on every replica.
	conversions *conversions
	// active is true while this replica runs the engine: only then does
	// it keep the CRDs of the kinds rules define.
	active atomic.Bool
	// again tries again the keeps that failed.
	again struct{ crds, revisions retrying }
}

// working says whether this replica runs the engine from now on; when it
// starts to, it keeps the CRDs and revisions of the set in force first.
func (f *ruleFiles) working(ctx context.Context, active bool) {
	f.active.Store(active)
	if active {
		f.inForce(ctx, f.current.get())
	}
}

// inForce does, on a replica that runs the rules, what putting set in
// force takes before the engine sees it: the CRDs of the kinds its rules
// define, a revision of each rule, and the load's outcome said on the
// rules ConfigMap. A dry run writes none of it (its plan shows the CRDs).
func (f *ruleFiles) inForce(ctx context.Context, set *rules.Set) {
	if !f.active.Load() {
		return
	}
	f.keepCRDs(ctx, set)
	if f.crds.dryRun == nil {
		f.keepRevisions(ctx, set)
		f.announcer.announce(ctx, platformErrors(f.files.get()), set.Len())
		f.tenants.announce(f.files.get())
	}
}

// count counts a load of the rule files, with errs, that made set; each
// rule's series are made at 0 before its CRD, its revision or its loop
// can count anything.
func (f *ruleFiles) count(set *rules.Set, errs []reload.FileError) {
	f.metrics.Reloaded(len(errs) > 0)
	f.metrics.RulesLoaded(set.Len())
	for _, r := range set.Rules() {
		f.metrics.RuleLoaded(r.Name, r.API != nil)
	}
}

// broken are the files among errs, true for those whose last good version
// is in force.
func broken(errs []reload.FileError) map[string]bool {
	out := map[string]bool{}
	for _, e := range errs {
		out[e.Path] = e.LastGood
	}
	return out
}

func newRuleFiles(logger klog.Logger, o Options, c *Clients, m *metrics.Metrics) (*ruleFiles, error) {
	loader, err := rules.NewLoader(expr.Options{CostLimit: o.CostLimit})
	if err != nil {
		return nil, err
	}
	loader.ReportPanics(func(path string, pe *panics.Error) {
		reportPanic(logger.WithValues("file", path), m.Panicked, "", panicLoad, pe)
	})
	if err := loader.SetInstallation(o.Installation); err != nil {
		return nil, err
	}
	if err := loader.SetIdentities(o.SyncloopNamespace, o.Identities.Default); err != nil {
		return nil, err
	}
	loader.UseSchemas(c.Schemas)
	loader.UseScopes(c.Mapper)
	loader.SetConversionWebhook(o.CRDs.Webhook)
	crds := newCRDKeeper(c, !o.CRDs.NoManage)
	crds.applied, crds.panicked = m.CRDApplied, m.Panicked
	loader.UseServedCRDs(crds, crds.manage)
	src := reload.NewSource(loader, o.Rules)
	revisions := newRevisionKeeper(c, o.SyncloopNamespace, o.Installation)
	src.UseLastGood(revisions.lastGood(loader))
	revisions.compile = compileRevision(loader.ForRevisions())
	revisions.compileRemoved = compileRevision(loader.ForInspection())
	revisions.panicked = m.Panicked
	f := &ruleFiles{src: src, watcher: reload.NewWatcher(src, 0), clients: c, metrics: m,
		files: &fileErrors{}, current: &currentSet{}, updates: make(chan *rules.Set, 1), crds: crds,
		revisions: revisions}
	if o.Identities.Tenants {
		f.tenants = &tenants{core: c.Core, namespace: o.Namespace, src: src, changed: f.watcher.Reload}
	}
	return f, nil
}

// compileRevision compiles the rule a revision object of rule r holds:
// a tenant rule's as a tenant rule of its namespace.
func compileRevision(l *rules.Loader) func(*rules.Rule, string, []byte) (*rules.Rule, error) {
	return func(r *rules.Rule, name string, source []byte) (*rules.Rule, error) {
		loader := l
		if r.Tenant != "" {
			var err error
			if loader, err = l.ForTenant(r.Tenant); err != nil {
				return nil, err
			}
		}
		f, err := loader.Parse(revisionSource+name, source)
		if err != nil {
			return nil, err
		}
		if len(f.Rules) != 1 {
			return nil, fmt.Errorf("revision %s holds %d rules, not one", name, len(f.Rules))
		}
		return f.Rules[0], nil
	}
}

// keepCRDs keeps the CRDs of the kinds set's rules define, before the set
// is put in force; when one cannot be kept it tries again, with the set
// then in force, until it can (or ctx ends).
func (f *ruleFiles) keepCRDs(ctx context.Context, set *rules.Set) {
	if f.crds.keep(ctx, set) {
		f.retry(ctx, &f.again.crds, f.crds.keep)
	}
}

// keepRevisions records the revisions of set's rules, before the set is
// put in force; when one cannot be recorded it tries again, with the set
// then in force, until it can — a version that ran and was not recorded
// is lost to a start that finds its file broken.
func (f *ruleFiles) keepRevisions(ctx context.Context, set *rules.Set) {
	keep := func(ctx context.Context, set *rules.Set) bool {
		return f.revisions.keep(ctx, set, broken(f.files.get()))
	}
	if keep(ctx, set) {
		f.retry(ctx, &f.again.revisions, keep)
	}
}

// retry calls keep with the set in force after 2 s, doubling to a
// minute, until it reports no failure, ctx ends or this replica no longer
// runs the rules. One goroutine tries for each r; a failure meanwhile
// makes it try once more even when its own keep succeeds.
func (f *ruleFiles) retry(ctx context.Context, r *retrying, keep func(context.Context, *rules.Set) (failed bool)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running {
		r.more = true
		return
	}
	r.running = true
	go func() {
		for delay := 2 * time.Second; ; delay = min(2*delay, time.Minute) {
			select {
			case <-ctx.Done():
			case <-time.After(delay):
			}
			failed := ctx.Err() == nil && f.active.Load() && keep(ctx, f.current.get())
			r.mu.Lock()
			if !failed && (!r.more || ctx.Err() != nil || !f.active.Load()) {
				r.running, r.more = false, false
				r.mu.Unlock()
				return
			}
			r.more = false
			r.mu.Unlock()
		}
	}()
}

// retrying is a keep tried again (retry).
type retrying struct {
	mu            sync.Mutex
	running, more bool
}

// load starts watching CRDs, loads the rule files — after the schemas of
// CRDs created just before, if they come soon — reports what did not load,
// and puts the set in force.
func (f *ruleFiles) load(ctx context.Context) *rules.Set {
	logger := klog.FromContext(ctx)
	served := f.clients.Schemas
	dynamic.WatchCRDs(ctx, f.clients.Metadata, 5*time.Second, func(group string, initial bool) {
		switch set := f.current.get(); {
		case initial:
			f.installed.Store(group, true)
		case set != nil && usesGroup(set, group), len(f.files.get()) > 0:
			// A broken file may be broken by this CRD: it is checked too.
			f.recheck(ctx, group)
		default:
			served.Forget(group)
		}
	})
	if f.tenants != nil {
		f.tenants.start(ctx)
	}
	// A broken file's last good version follows the revisions: one that
	// another replica records after this one asked runs here too.
	f.revisions.store.Watch(ctx, f.clients.Metadata, f.revisions.selector(), f.watcher.AskAgain)
	if c := f.conversions.certs; c != nil {
		// A new CA must reach every CRD that converts before the serving
		// certificate is signed by it.
		c.OnBundleChange(func() {
			if f.active.Load() {
				f.keepCRDs(ctx, f.current.get())
			}
		})
	}
	loaded := f.src.Load()
	if f.awaitSchemas(ctx, loaded.Set) {
		f.src.Invalidate()
		loaded = f.src.Load()
	}
	f.files.report(logger, loaded.Errors)
	logWarnings(logger, loaded.Set)
	f.count(loaded.Set, loaded.Errors)
	f.conversions.use(ctx, loaded.Set)
	f.conversions.recover(ctx, f.crds.crds)
	f.inForce(ctx, loaded.Set)
	f.current.put(loaded.Set)
	return loaded.Set
}

// awaitSchemas waits, up to startSchemaWait, for the schemas of the CRDs
// set uses that the API server has not published yet: a CRD created just
// before syncloop started. It reports whether it waited: the rules are
// then loaded again, before anything starts, so that they start once,
// typed, instead of restarting (and reporting not ready) a moment after
// start. A schema that takes longer is checked again when it comes.
func (f *ruleFiles) awaitSchemas(ctx context.Context, set *rules.Set) bool {
	served := f.clients.Schemas
	var unpublished []string
	f.installed.Range(func(group, _ any) bool {
		if usesGroup(set, group.(string)) && served.Missing(group.(string)) {
			unpublished = append(unpublished, group.(string))
		}
		return true
	})
	deadline := time.Now().Add(startSchemaWait)
	for _, group := range unpublished {
		if !f.published(ctx, group, time.Until(deadline)) {
			f.recheck(ctx, group)
			continue
		}
		served.Forget(group)
	}
	return len(unpublished) > 0
}

// published waits, up to timeout, until the API server publishes group's
// schemas anew: it does so a moment after a CRD changes.
func (f *ruleFiles) published(ctx context.Context, group string, timeout time.Duration) bool {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		tags, err := f.clients.OpenAPI.Tags(group)
		return err == nil && f.clients.Schemas.Stale(group, tags), nil
	}) == nil
}

// recheck loads the rules that use group again once its schemas are
// published (at most 30 seconds on), or at once when no rule read them.
func (f *ruleFiles) recheck(ctx context.Context, group string) {
	go func() {
		if f.clients.Schemas.Fetched(group) {
			f.published(ctx, group, 30*time.Second)
		}
		f.clients.Schemas.Forget(group)
		klog.FromContext(ctx).Info("CustomResourceDefinition changed: checking the rules that use it again", "group", group)
		f.watcher.Recheck()
	}()
}

// watch follows the rule files until ctx ends (hot reload): each new set
// is put in force and waits in updates for the engine. The channel is
// closed once it has stopped.
func (f *ruleFiles) watch(ctx context.Context) <-chan struct{} {
	logger := klog.FromContext(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := f.watcher.Run(ctx, func(st reload.Status) {
			f.files.report(logger, st.Errors)
			logWarnings(logger, st.Set)
			f.count(st.Set, st.Errors)
			logger.Info("Rule files reloaded", "rules", st.Set.Len(), "fileErrors", len(st.Errors))
			f.conversions.use(ctx, st.Set)
			f.inForce(ctx, st.Set)
			f.current.put(st.Set)
			select {
			case <-f.updates: // superseded
			default:
			}
			f.updates <- st.Set
		})
		if err != nil {
			logger.Error(err, "Rule files are no longer watched: changes need a restart")
		}
	}()
	return done
}

// moduleRelease is how often the compiled modules no rule in force calls
// are released: one is closed by the second release that finds it so
// (rules.Loader.ReleaseModules), one to two periods after its rule
// changed or its rollout completed.
const moduleRelease = time.Minute

// releaseModules releases, every moduleRelease until ctx ends, the
// compiled modules that neither the set in force nor running (the rules
// the engine runs, a rollout's previous revision among them) calls. The
// channel is closed once it has stopped.
func (f *ruleFiles) releaseModules(ctx context.Context, running func() []*rules.Rule) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(moduleRelease)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			f.releaseOnce(ctx, running)
		}
	}()
	return done
}

// releaseOnce is one release of the modules no rule in force calls; a
// panic in it is contained and counted, and the next release tries again.
func (f *ruleFiles) releaseOnce(ctx context.Context, running func() []*rules.Rule) {
	logger := klog.FromContext(ctx)
	_ = containRule(logger, f.metrics.Panicked, "", panicModules, func() error {
		inForce := running()
		if set := f.current.get(); set != nil {
			inForce = append(inForce, set.Rules()...)
		}
		if n := f.src.Loader().ReleaseModules(ctx, inForce); n > 0 {
			logger.V(2).Info("Released the compiled modules no rule in force calls", "modules", n)
		}
		return nil
	})
}
