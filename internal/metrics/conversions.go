package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Conversions are the conversion webhook's metrics.
type Conversions struct {
	total   *prometheus.CounterVec
	latency *prometheus.HistogramVec
	expires prometheus.Gauge
}

// NewConversions registers the conversion webhook's metrics on reg.
func NewConversions(reg prometheus.Registerer) *Conversions {
	c := &Conversions{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "syncloop_conversions_total", Help: "Objects the conversion webhook converted for the API server, by kind, from and to version, and result (converted or failed).",
		}, []string{"kind", "from", "to", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "syncloop_conversion_duration_seconds", Help: "How long the conversion webhook took to answer one ConversionReview (all its objects), by kind.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16),
		}, []string{"kind"}),
		expires: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "syncloop_webhook_certificate_expiry_timestamp_seconds", Help: "When the conversion webhook's serving certificate expires (syncloop renews it a third of its life before).",
		}),
	}
	reg.MustRegister(c.total, c.latency, c.expires)
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

// CertificateExpires records when the serving certificate expires.
func (c *Conversions) CertificateExpires(t time.Time) { c.expires.Set(float64(t.Unix())) }
