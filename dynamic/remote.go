package dynamic

import (
	"context"
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Remote is how to reach another cluster: its client and mapper, made
// from a kubeconfig (internal/fleet makes them from kubeconfig Secrets).
type Remote struct {
	// Version changes when the kubeconfig does: a new Version is a new
	// client, and informers of the old one are stopped.
	Version string
	Client  *Client
	Mapper  *Mapper
	// Down says why the cluster is not reachable now; nil: it is, as far
	// as is known (no request has found it not answering since it last
	// did).
	Down func() error
	// Returns counts the times the cluster answered again after it did
	// not: watches of it made before then may be waiting out a backoff
	// grown while it was down, and are better made anew.
	Returns func() int
	// Failed tells whoever made the Remote that a request found no answer
	// (err): the cluster is down until it answers again.
	Failed func(err error)
}

// NoAnswer reports whether err is a request that found no answer — a
// connection refused or reset, a timeout — rather than an answer of the
// API server (a status, even an error one). A cancelled request is
// neither.
func NoAnswer(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var status apierrors.APIStatus
	return !errors.As(err, &status)
}

// Host is the address of the API server c reaches.
func (c *Client) Host() string { return c.config.Host }
