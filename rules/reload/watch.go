package reload

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"
)

// DefaultDebounce is how long the Watcher waits after the last file event
// before reloading: editors and the kubelet touch several files per change.
const DefaultDebounce = 250 * time.Millisecond

// A file that failed to load for the cluster's reasons (rules.Retryable)
// is loaded again after RetryFirst, doubling to RetryMax while it fails.
const (
	RetryFirst = time.Second
	RetryMax   = time.Minute
)

// Watcher reloads a Source when its files change.
type Watcher struct {
	src      *Source
	debounce time.Duration
	ready    chan struct{}
	recheck  chan struct{}
	reload   chan struct{}
	askAgain chan struct{}
}

// NewWatcher returns a Watcher over src; debounce 0 means DefaultDebounce.
func NewWatcher(src *Source, debounce time.Duration) *Watcher {
	if debounce == 0 {
		debounce = DefaultDebounce
	}
	return &Watcher{src: src, debounce: debounce, ready: make(chan struct{}), recheck: make(chan struct{}, 1), reload: make(chan struct{}, 1),
		askAgain: make(chan struct{}, 1)}
}

// Recheck makes Run parse every file again after the debounce, as if all
// had changed: the schemas they are checked against did. Safe to call from
// any goroutine; calls during one debounce are one recheck.
func (w *Watcher) Recheck() {
	select {
	case w.recheck <- struct{}{}:
	default:
	}
}

// Reload makes Run load the Source again after the debounce: its tenant
// files changed (Source.SetTenantFiles). Safe to call from any goroutine.
func (w *Watcher) Reload() {
	select {
	case w.reload <- struct{}{}:
	default:
	}
}

// AskAgain makes Run ask again, after the debounce, for the last good
// version of each broken file (Source.AskAgain): the rules' revisions
// changed. Nothing is loaded when no file is broken. Safe to call from
// any goroutine.
func (w *Watcher) AskAgain() {
	select {
	case w.askAgain <- struct{}{}:
	default:
	}
}

// Ready is closed once Run watches the files: changes made after it are
// seen.
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

// Run watches the Source's roots until ctx ends. After each burst of file
// events it loads the Source again and, when anything changed, calls
// onReload with the result — from Run's goroutine, one call at a time.
//
// It watches every directory under the roots and each root's parent
// directory, so that files and directories that are replaced, renamed over,
// deleted or re-created — including a ConfigMap volume's "..data" symlink
// swap — are all seen.
func (w *Watcher) Run(ctx context.Context, onReload func(Status)) error {
	logger := klog.FromContext(ctx)
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer fw.Close()
	w.addWatches(ctx, fw)
	close(w.ready)

	// A first look once the watches are in place: a file changed between
	// the caller's first Load and now sent no event here, and would
	// otherwise wait for the next change (a standby replica once took
	// over with the rules it started with). Unchanged, it reloads nothing.
	timer := time.NewTimer(w.debounce)
	invalidate := false
	retry := time.Duration(0) // the wait before loading again a file that failed for the cluster's reasons
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return errors.New("fsnotify closed its event channel")
			}
			if w.relevant(ev.Name) {
				logger.V(4).Info("Rule file event", "event", ev.String())
				timer.Reset(w.debounce)
			}
		case err, ok := <-fw.Errors:
			if !ok {
				return errors.New("fsnotify closed its error channel")
			}
			// An overflow loses events: reload to be sure.
			logger.Error(err, "Watching rule files")
			timer.Reset(w.debounce)
		case <-w.recheck:
			invalidate = true
			timer.Reset(w.debounce)
		case <-w.reload:
			timer.Reset(w.debounce)
		case <-w.askAgain:
			if w.src.AskAgain() {
				timer.Reset(w.debounce)
			}
		case <-timer.C:
			if invalidate {
				w.src.Invalidate()
				invalidate = false
			}
			st := w.src.Load()
			w.addWatches(ctx, fw) // new directories, re-created roots
			switch {
			case st.Unsettled:
				// A file emptied: look again after a pause, whether or
				// not its write sends another event.
				logger.V(2).Info("A rule file read empty; its rules stay until it is read empty again")
				timer.Reset(w.debounce)
			case st.Retry:
				// A read of the cluster failed: try the file again, with
				// backoff, whether or not anything changes meanwhile.
				retry = min(max(2*retry, RetryFirst), RetryMax)
				logger.V(1).Info("A rule file could not be checked against the cluster: loading it again", "in", retry)
				timer.Reset(retry)
			default:
				retry = 0
			}
			if st.Changed {
				onReload(st)
			}
		}
	}
}

// relevant reports whether an event path is a root or under one.
func (w *Watcher) relevant(path string) bool {
	for _, root := range w.src.roots {
		if under(path, root) {
			return true
		}
	}
	return false
}

// addWatches watches each root's parent and every directory under each
// root. fsnotify's Add is idempotent; paths that do not exist are skipped.
func (w *Watcher) addWatches(ctx context.Context, fw *fsnotify.Watcher) {
	logger := klog.FromContext(ctx)
	add := func(dir string) {
		if err := fw.Add(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			logger.Error(err, "Cannot watch directory", "dir", dir)
		}
	}
	for _, root := range w.src.roots {
		add(filepath.Dir(filepath.Clean(root)))
		fi, err := os.Stat(root)
		if err != nil || !fi.IsDir() {
			continue
		}
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if d.IsDir() {
				if p != root && strings.HasPrefix(d.Name(), ".") {
					return filepath.SkipDir
				}
				add(p)
			}
			return nil
		})
	}
}
