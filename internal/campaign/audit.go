package campaign

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
)

// identities is the namespace of the ServiceAccounts syncloop's replicas
// act as: one per start of a replica, so that the audit log tells every
// incarnation apart.
const identities = "campaign-identities"

// auditPolicy records every write syncloop's identities make, with the
// request and the answer, and nothing else: the campaign's own writes are
// in its history, reads and Leases say nothing of safety.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
  - level: None
    verbs: [get, list, watch]
  - level: None
    resources:
      - {group: coordination.k8s.io, resources: [leases]}
      - {group: "", resources: [events]}
  - level: RequestResponse
    userGroups: ["system:serviceaccounts:` + identities + `"]
  - level: None
`

// auditArgs writes the policy into dir and returns the kube-apiserver
// flags that log to dir/audit.log.
func auditArgs(dir string) ([]string, string, error) {
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		return nil, "", err
	}
	log := filepath.Join(dir, "audit.log")
	return []string{"--audit-policy-file=" + policy, "--audit-log-path=" + log, "--audit-log-format=json",
		"--audit-log-mode=blocking", "--audit-log-maxsize=0"}, log, nil
}

// write is one write syncloop made, as the API server recorded it.
type write struct {
	at       time.Time
	user     string // the incarnation: system:serviceaccount:<identities>:<name>
	verb     string // create, update, patch, delete
	resource string // "configmaps", "controllerrevisions.apps", …
	ns, name string
	code     int
	// object is the answer: the object as written (for a delete, as it
	// was deleted); nil when the answer was not an object.
	object *unstructured.Unstructured
}

func (w write) ok() bool { return w.code >= 200 && w.code < 300 }

func (w write) String() string {
	return fmt.Sprintf("%s %s %s %s/%s by %s → %d", w.at.Format("15:04:05.000000"), w.verb, w.resource, w.ns, w.name, strings.TrimPrefix(w.user, "system:serviceaccount:"+identities+":"), w.code)
}

// readAudit reads the writes of syncloop's identities from the audit log
// at path, in the order they completed.
func readAudit(path string) ([]write, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []write
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e auditv1.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("audit log: %w", err)
		}
		if e.Stage != auditv1.StageResponseComplete || e.ObjectRef == nil || !strings.HasPrefix(e.User.Username, "system:serviceaccount:"+identities+":") {
			continue
		}
		w := write{at: e.StageTimestamp.Time, user: e.User.Username, verb: e.Verb, resource: e.ObjectRef.Resource,
			ns: e.ObjectRef.Namespace, name: e.ObjectRef.Name}
		if e.ObjectRef.APIGroup != "" {
			w.resource += "." + e.ObjectRef.APIGroup
		}
		if e.ObjectRef.Subresource != "" {
			w.resource += "/" + e.ObjectRef.Subresource
		}
		if e.ResponseStatus != nil {
			w.code = int(e.ResponseStatus.Code)
		}
		if e.ResponseObject != nil && len(e.ResponseObject.Raw) > 0 {
			var m map[string]any
			if json.Unmarshal(e.ResponseObject.Raw, &m) == nil && m["kind"] != "Status" {
				w.object = &unstructured.Unstructured{Object: m}
			}
		}
		out = append(out, w)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out, nil
}
