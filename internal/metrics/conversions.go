package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Conversions are the conversion webhook's metrics.
type Conversions struct {
	total   *prometheus.CounterVec
	latency *prometheus.HistogramVec
	refused *prometheus.CounterVec
	expires prometheus.Gauge
	// migrated and migrating are the storage migrations'.
	migrated  *prometheus.CounterVec
	migrating *prometheus.GaugeVec
}

// NewConversions registers the conversion webhook's metrics on reg; the
// refusals counted are reasons (each at 0 from the start).
func NewConversions(reg prometheus.Registerer, reasons []string) *Conversions {
	c := &Conversions{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "syncloop_conversions_total", Help: "Objects the conversion webhook converted for the API server, by kind, from and to version, and result (converted or failed); a kind syncloop does not convert, or a version not the kind's, is \"other\".",
		}, []string{"kind", "from", "to", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "syncloop_conversion_duration_seconds", Help: "How long the conversion webhook took to answer one ConversionReview (all its objects), by kind (\"other\": a kind syncloop does not convert).",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16),
		}, []string{"kind"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "syncloop_conversion_reviews_refused_total", Help: "ConversionReviews the conversion webhook answered without converting them, by reason: too-large (the body, or what decoding an object would hold), busy (429: too many in flight; the API server sends it again), malformed (not a ConversionReview).",
		}, []string{"reason"}),
		expires: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "syncloop_webhook_certificate_expiry_timestamp_seconds", Help: "When the conversion webhook's serving certificate expires (syncloop renews it a third of its life before).",
		}),
	}
	c.migrated = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "syncloop_storage_migration_objects_total", Help: "Objects a storage migration read and updated so that they are stored in their kind's storage version, by CRD and result (rewritten, gone, failed).",
	}, []string{"crd", "result"})
	c.migrating = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "syncloop_storage_migration_running", Help: "1 while the objects of a CRD are being moved to its storage version.",
	}, []string{"crd"})
	for _, r := range reasons {
		c.refused.WithLabelValues(r)
	}
	reg.MustRegister(c.total, c.latency, c.refused, c.expires, c.migrated, c.migrating)
	return c
}

// Converted counts one object converted (webhook.Metrics).
func (c *Conversions) Converted(kind, from, to, result string) {
	c.total.WithLabelValues(kind, from, to, result).Inc()
}

// Reviewed records one review's latency (webhook.Metrics).
func (c *Conversions) Reviewed(kind string, d time.Duration) {
	c.latency.WithLabelValues(kind).Observe(d.Seconds())
}

// Refused counts one review refused unread (webhook.Metrics).
func (c *Conversions) Refused(reason string) { c.refused.WithLabelValues(reason).Inc() }

// CertificateExpires records when the serving certificate expires.
func (c *Conversions) CertificateExpires(t time.Time) { c.expires.Set(float64(t.Unix())) }

// Migrated counts one object of a storage migration.
func (c *Conversions) Migrated(crd, result string) { c.migrated.WithLabelValues(crd, result).Inc() }

// Migrating marks a storage migration of crd running or not.
func (c *Conversions) Migrating(crd string, on bool) {
	v := 0.0
	if on {
		v = 1
	}
	c.migrating.WithLabelValues(crd).Set(v)
}
