package fleet

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
)

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{}) }

// invalids counts KubeconfigInvalid by cluster.
type invalids struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *invalids) KubeconfigInvalid(cluster string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[cluster]++
}

func (c *invalids) of(cluster string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[cluster]
}

// TestInventory: the kubeconfig Secrets labelled with Cluster API's
// cluster-name in the namespace are the clusters, labelled as the Secrets
// are; a relabel changes the labels without a new client; a kubeconfig
// that makes no client is a Warning Event on its Secret that holds none of
// its secrets, and a metric; a deleted Secret's cluster leaves.
//
// API server: Secrets listed and watched in one namespace.
func TestInventory(t *testing.T) {
	env := testenv.Get(t)
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ns, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "fleet-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	recorder := record.NewFakeRecorder(20)
	counts := &invalids{n: map[string]int{}}
	inv := New(cs, ns.Name, Options{Recorder: recorder, Metrics: counts})
	go inv.Run(t.Context())
	changes := make(chan struct{}, 100)
	defer inv.Subscribe(func() { changes <- struct{}{} })()
	if !inv.WaitForSync(t.Context()) {
		t.Fatal("the inventory did not sync")
	}

	kubeconfig, err := os.ReadFile(env.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	put := func(name string, labels map[string]string, value []byte) {
		t.Helper()
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-kubeconfig", Labels: labels}, Data: map[string][]byte{KubeconfigKey: value}}
		if _, err := cs.CoreV1().Secrets(ns.Name).Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
	labelsOf := func(name string) map[string]string {
		for _, c := range inv.Clusters() {
			if c.Name == name {
				return c.Labels
			}
		}
		return nil
	}

	put("east", map[string]string{rules.LabelClusterName: "east", "env": "prod"}, kubeconfig)
	put("plain", nil, kubeconfig) // not labelled: not a cluster
	eventually("cluster east", func() bool { return labelsOf("east")["env"] == "prod" })
	remote, ok := inv.Reach("east")
	if !ok || remote.Client == nil || remote.Client.Host() != env.Config().Host || remote.Down() != nil {
		t.Fatalf("east reached %v at %v", ok, remote)
	}
	// A request that finds no answer marks it down; the probe brings it
	// back, and counts the return (its watches are made anew).
	remote.Failed(errors.New("dial tcp: connection refused"))
	if st := inv.Statuses(); len(st) != 1 || st[0].Name != "east" || st[0].Down == nil || len(inv.Unreachable()) != 1 {
		t.Fatalf("statuses %v after a request found no answer, want east down", st)
	}
	eventually("east answering again", func() bool { return inv.Statuses()[0].Down == nil && remote.Returns() == 1 })
	if _, err := cs.CoreV1().Secrets(ns.Name).Patch(t.Context(), "east-kubeconfig", types.MergePatchType, []byte(`{"metadata":{"labels":{"env":"dev"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("east relabelled", func() bool { return labelsOf("east")["env"] == "dev" })
	if again, _ := inv.Reach("east"); again.Version != remote.Version || again.Client != remote.Client {
		t.Error("a relabelled cluster got a new client")
	}
	if len(changes) == 0 {
		t.Error("subscribers were not told of the changes")
	}

	const token = "s3cr3t-t0ken-do-not-print"
	broken := "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user: {token: " + token + "}\n  : [\n"
	put("west", map[string]string{rules.LabelClusterName: "west"}, []byte(broken))
	noContext := strings.Replace(string(kubeconfig), "current-context: testenv", "current-context: "+token, 1)
	put("north", map[string]string{rules.LabelClusterName: "north"}, []byte(noContext))
	put("south", map[string]string{rules.LabelClusterName: "south"}, nil)
	// The attack: a kubeconfig that runs a shell as syncloop. Its labels
	// would satisfy a rule's selector; it never makes a client.
	marker := filepath.Join(t.TempDir(), "ran")
	shell := strings.Replace(string(kubeconfig), "    token: ", "    exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, 'touch "+marker+"'], interactiveMode: Never}\n    token: ", 1)
	if shell == string(kubeconfig) {
		t.Fatalf("the kubeconfig has no token to put an exec beside:\n%s", kubeconfig)
	}
	put("evil", map[string]string{rules.LabelClusterName: "evil", "env": "prod"}, []byte(shell))
	var events []string
	eventually("four BadKubeconfig Events", func() bool {
		select {
		case e := <-recorder.Events:
			events = append(events, e)
		default:
		}
		return len(events) == 4
	})
	for _, e := range events {
		if !strings.HasPrefix(e, "Warning "+ReasonBadKubeconfig+" ") || strings.Contains(e, token) {
			t.Errorf("event %q: want a BadKubeconfig Warning without the kubeconfig's secrets", e)
		}
	}
	joined := strings.Join(events, "\n")
	for _, want := range []string{`cluster "west"`, "does not parse (line", `cluster "north"`, `cluster "south"`, `no key "value"`,
		`cluster "evil"`, "exec: a kubeconfig from a Secret may not run a program", FlagExec + " allows it"} {
		if !strings.Contains(joined, want) {
			t.Errorf("events lack %q:\n%s", want, joined)
		}
	}
	for _, c := range []string{"west", "north", "south", "evil"} {
		if counts.of(c) != 1 || labelsOf(c) != nil {
			t.Errorf("cluster %s: counted %d, in the inventory %v", c, counts.of(c), labelsOf(c) != nil)
		}
	}
	if err := inv.LeftOut("evil"); err == nil || !strings.Contains(err.Error(), "evil-kubeconfig was left out") || !strings.Contains(err.Error(), FlagExec) {
		t.Errorf("LeftOut(evil) = %v, want its Secret and the flag named", err)
	}
	if _, ok := inv.Reach("evil"); ok {
		t.Error("a kubeconfig that runs a program is reached")
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the kubeconfig's command ran")
	}

	if err := cs.CoreV1().Secrets(ns.Name).Delete(t.Context(), "east-kubeconfig", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("east to leave", func() bool { return len(inv.Clusters()) == 0 })
	if _, ok := inv.Reach("east"); ok {
		t.Error("a cluster whose Secret is gone is still reached")
	}
}

// TestInventoryAliases: two kubeconfig Secrets of one API server are one
// cluster: the older keeps it, the other is a Warning Event and the
// metric, out of the inventory, and comes in once the first leaves. A
// one-shot Load, listing the younger first, settles on the older too.
//
// API server: Secrets listed and watched in one namespace.
func TestInventoryAliases(t *testing.T) {
	env := testenv.Get(t)
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ns, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "fleet-aliases-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := os.ReadFile(env.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	host := env.Config().Host
	// The same server written otherwise: upper case, a trailing slash.
	otherwise := []byte(strings.Replace(string(kubeconfig), "server: "+host, "server: "+strings.ToUpper(host)+"/", 1))
	if string(otherwise) == string(kubeconfig) {
		t.Fatalf("the kubeconfig names no server %s", host)
	}
	put := func(name string, value []byte) *corev1.Secret {
		t.Helper()
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-kubeconfig", Labels: map[string]string{rules.LabelClusterName: name}},
			Data: map[string][]byte{KubeconfigKey: value}}
		made, err := cs.CoreV1().Secrets(ns.Name).Create(t.Context(), s, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return made
	}
	names := func(inv *Inventory) string {
		var out []string
		for _, c := range inv.Clusters() {
			out = append(out, c.Name)
		}
		return strings.Join(out, ",")
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("timed out waiting for %s", what)
		}
	}

	// Named b, created first: a one-shot Load lists a first.
	older := put("b", kubeconfig)
	eventually("a second after b's creation", func() bool { return time.Now().Truncate(time.Second).After(older.CreationTimestamp.Time) })
	put("a", otherwise)
	once := New(cs, ns.Name, Options{})
	if err := once.Load(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := names(once); got != "b" {
		t.Errorf("loaded once: clusters %q, want b, whose Secret is older", got)
	}

	recorder := record.NewFakeRecorder(20)
	counts := &invalids{n: map[string]int{}}
	inv := New(cs, ns.Name, Options{Recorder: recorder, Metrics: counts})
	go inv.Run(t.Context())
	defer inv.Subscribe(func() {})()
	if !inv.WaitForSync(t.Context()) {
		t.Fatal("the inventory did not sync")
	}
	if got := names(inv); got != "b" || counts.of("a") == 0 {
		t.Fatalf("watched: clusters %q, a counted %d; want b alone, a counted", got, counts.of("a"))
	}
	var event string
	eventually("a Warning Event on a's Secret", func() bool {
		select {
		case event = <-recorder.Events:
		default:
		}
		return event != ""
	})
	if !strings.HasPrefix(event, "Warning "+ReasonBadKubeconfig) || !strings.Contains(event, `cluster "a"`) || !strings.Contains(event, `is cluster "b"'s already`) {
		t.Errorf("event %q: want a's Secret told that b's has its server", event)
	}

	if err := cs.CoreV1().Secrets(ns.Name).Delete(t.Context(), "b-kubeconfig", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("a to come in once b left", func() bool { return names(inv) == "a" })
	if remote, ok := inv.Reach("a"); !ok || remote.Client == nil {
		t.Error("a is in the inventory but not reached")
	}
}
