package main

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/syncloop/syncloop/rules"
)

// webhookFlags say where the API server reaches the conversion webhook of
// the kinds rules define in several versions.
type webhookFlags struct {
	url, service string
	// certManager is run's --webhook-cert-manager, clientCA its
	// --webhook-client-ca.
	certManager, clientCA string
}

func (f *webhookFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.service, "webhook-service", "", "NAMESPACE/NAME[:PORT] of the Service in front of syncloop's conversion webhook, which the CRDs of kinds of several versions name (default: "+rules.DefaultWebhookService+" in syncloop's namespace, port 443; the chart sets it)")
	cmd.Flags().StringVar(&f.url, "webhook-url", "", "https URL of syncloop's conversion webhook (ending in "+rules.WebhookPath+"), instead of --webhook-service: for a syncloop outside the cluster")
}

// config is the webhook the flags name; zero for the default Service.
func (f *webhookFlags) config() (rules.ConversionWebhook, error) {
	var w rules.ConversionWebhook
	switch {
	case f.url != "" && f.service != "":
		return w, fmt.Errorf("--webhook-url and --webhook-service are exclusive")
	case f.url != "":
		u, err := url.Parse(f.url)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return w, fmt.Errorf("--webhook-url %q: an https URL, e.g. https://10.0.0.1:9443%s", f.url, rules.WebhookPath)
		}
		w.URL = f.url
	case f.service != "":
		ns, rest, ok := strings.Cut(f.service, "/")
		name, port, hasPort := strings.Cut(rest, ":")
		if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Label(name)) > 0 {
			return w, fmt.Errorf("--webhook-service %q: NAMESPACE/NAME[:PORT]", f.service)
		}
		w.Namespace, w.Name = ns, name
		if hasPort {
			p, err := strconv.ParseInt(port, 10, 32)
			if err != nil || p < 1 || p > 65535 {
				return w, fmt.Errorf("--webhook-service %q: the port is a number from 1 to 65535", f.service)
			}
			w.Port = int32(p)
		}
	}
	return w, nil
}
