package manager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/rules"
)

// HeldOptions say whose teardown finalizers HeldObjects finds and
// ReleaseHeld takes off.
type HeldOptions struct {
	// Installation is the installation of syncloop whose finalizers these
	// are ("": the default one).
	Installation string
	// Namespace, when set, limits the search to the namespaced kinds of
	// that namespace (run --watch-namespace).
	Namespace string
	// DryRun sends each removal as a server-side dry run.
	DryRun bool
}

// Held is an object that holds teardown finalizers of syncloop: a trigger
// of a rule that orders its teardown (rules.TeardownOrdered).
type Held struct {
	Resource   schema.GroupVersionResource `json:"resource"`
	Namespace  string                      `json:"namespace,omitempty"`
	Name       string                      `json:"name"`
	Finalizers []string                    `json:"finalizers"`
	// Deleting: the object is being deleted, and waits for them.
	Deleting bool `json:"deleting"`
	uid      types.UID
	all      []string // every finalizer the object holds
}

// HeldObjects finds every object, of every kind the cluster serves that
// can be listed and patched, that holds a teardown finalizer of the
// installation — without the rules: those of rules removed, of tenants
// and of files gone are found too. It lists metadata only. unlisted are
// the resources the caller may not list (Forbidden), which it skips.
func HeldObjects(ctx context.Context, cl *Clients, o HeldOptions) (held []Held, unlisted []string, err error) {
	resources, err := patchableResources(cl.Discovery, o.Namespace != "")
	if err != nil {
		return nil, nil, err
	}
	for _, gvr := range resources {
		found, err := heldOf(ctx, cl, gvr, o)
		switch {
		case apierrors.IsForbidden(err):
			unlisted = append(unlisted, gvr.GroupResource().String())
		case apierrors.IsNotFound(err), apierrors.IsMethodNotSupported(err):
			// no longer served, or not listable after all
		case err != nil:
			return nil, nil, fmt.Errorf("listing %s: %w", gvr.GroupResource(), err)
		}
		held = append(held, found...)
	}
	return held, unlisted, nil
}

// heldOf lists one resource, page by page, for objects holding the
// installation's teardown finalizers.
func heldOf(ctx context.Context, cl *Clients, gvr schema.GroupVersionResource, o HeldOptions) ([]Held, error) {
	var out []Held
	opts := metav1.ListOptions{Limit: 500}
	for {
		list, err := cl.Metadata.Resource(gvr).Namespace(o.Namespace).List(ctx, opts)
		if err != nil {
			return out, err
		}
		for _, item := range list.Items {
			fs := slices.DeleteFunc(slices.Clone(item.Finalizers), func(f string) bool { return !rules.IsTeardownFinalizer(f, o.Installation) })
			if len(fs) > 0 {
				out = append(out, Held{Resource: gvr, Namespace: item.Namespace, Name: item.Name, Finalizers: fs,
					Deleting: item.DeletionTimestamp != nil, uid: item.UID, all: item.Finalizers})
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return out, nil
		}
	}
}

// patchableResources are the resources the cluster serves, in their
// preferred versions, that can be listed and patched (no subresources);
// namespacedOnly leaves out the cluster-scoped. A group whose discovery
// fails (an aggregated API that is down) is left out.
func patchableResources(dc discovery.DiscoveryInterface, namespacedOnly bool) ([]schema.GroupVersionResource, error) {
	lists, err := dc.ServerPreferredResources()
	if err != nil && !discovery.IsGroupDiscoveryFailedError(err) {
		return nil, fmt.Errorf("discovering the cluster's kinds: %w", err)
	}
	var out []schema.GroupVersionResource
	for _, list := range lists {
		gv, err := schema.ParseGroupVersion(list.GroupVersion)
		if err != nil {
			continue
		}
		for _, r := range list.APIResources {
			if strings.Contains(r.Name, "/") || (namespacedOnly && !r.Namespaced) ||
				!slices.Contains(r.Verbs, "list") || !slices.Contains(r.Verbs, "patch") {
				continue
			}
			out = append(out, gv.WithResource(r.Name))
		}
	}
	return out, nil
}

// ReleaseHeld takes the installation's teardown finalizers off every
// object that holds one (HeldObjects), calling each for every object
// released, and returns how many it released. A syncloop still running
// puts its finalizer back on the triggers of its rules, and one still
// stopping may: while a pass releases some, another follows after
// passGap, until ctx ends. Uninstalling, run it once syncloop is gone.
func ReleaseHeld(ctx context.Context, cl *Clients, o HeldOptions, each func(Held)) (released int, unlisted []string, err error) {
	for pass := 0; ; pass++ {
		held, unl, err := HeldObjects(ctx, cl, o)
		if err != nil {
			return released, unl, err
		}
		unlisted = unl
		n, moved := 0, false
		var errs []error
		for _, h := range held {
			err := release(ctx, cl, h, o)
			if errors.Is(err, errMoved) {
				moved = true
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w", h.Resource.GroupResource(), h.Object(), err))
				continue
			}
			n++
			each(h)
		}
		released += n
		if len(errs) > 0 {
			return released, unlisted, errors.Join(errs...)
		}
		if (n == 0 && !moved) || o.DryRun {
			return released, unlisted, nil
		}
		select {
		case <-ctx.Done():
			return released, unlisted, fmt.Errorf("finalizers were put back %d times: is syncloop still running? %w", pass+1, ctx.Err())
		case <-time.After(passGap):
		}
	}
}

// passGap is the wait between two passes of ReleaseHeld.
var passGap = 5 * time.Second

// errMoved: an object's finalizers changed since it was listed.
var errMoved = errors.New("the finalizers changed meanwhile")

// release takes h's teardown finalizers off, from the object as listed.
// A patch that finds the finalizers moved fails its test (errMoved): the
// next pass reads the object again.
func release(ctx context.Context, cl *Clients, h Held, o HeldOptions) error {
	obj := &metav1.ObjectMeta{Namespace: h.Namespace, Name: h.Name, UID: h.uid, Finalizers: h.all}
	patch, ok, err := dynamic.FinalizersPatch(obj, func(f string) bool { return slices.Contains(h.Finalizers, f) })
	if !ok || err != nil {
		return err
	}
	opts := metav1.PatchOptions{}
	if o.DryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = cl.Metadata.Resource(h.Resource).Namespace(h.Namespace).Patch(ctx, h.Name, types.JSONPatchType, patch, opts)
	switch {
	case apierrors.IsNotFound(err):
		return nil // gone meanwhile
	case apierrors.IsInvalid(err): // a test failed (422)
		return fmt.Errorf("%w: %w", errMoved, err)
	}
	return err
}

// Object is the held object's namespace/name, or name when cluster-scoped.
func (h Held) Object() string {
	if h.Namespace == "" {
		return h.Name
	}
	return h.Namespace + "/" + h.Name
}
