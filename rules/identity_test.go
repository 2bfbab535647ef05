package rules

import (
	"strings"
	"testing"

	"github.com/syncloop/syncloop/rules/expr"
)

func TestIdentity(t *testing.T) {
	newLoader := func(home string, def ServiceAccount) *Loader {
		l, err := NewLoader(expr.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.SetIdentities(home, def); err != nil {
			t.Fatal(err)
		}
		return l
	}
	parse := func(l *Loader, extra string) (*Rule, error) {
		f, err := l.Parse("rule.yaml", []byte(rolloutDoc(extra)))
		if err != nil {
			return nil, err
		}
		return f.Rules[0], nil
	}
	def := ServiceAccount{Namespace: "platform", Name: "rules"}
	for _, tc := range []struct {
		name      string
		home      string
		def       ServiceAccount
		extra     string
		want      ServiceAccount
		wantUser  string
		wantShown string
	}{
		{name: "syncloop's own", want: ServiceAccount{}},
		{name: "the default", def: def, want: def, wantUser: "system:serviceaccount:platform:rules", wantShown: "platform/rules"},
		{name: "own name in syncloop's namespace", home: "syncloop", def: def, extra: "  serviceAccountName: deployer\n",
			want: ServiceAccount{Namespace: "syncloop", Name: "deployer"}},
		{name: "own name, no home: default", extra: "  serviceAccountName: deployer\n",
			want: ServiceAccount{Namespace: DefaultServiceAccountNamespace, Name: "deployer"}},
		{name: "own namespace", home: "syncloop", extra: "  serviceAccountName: deployer\n  serviceAccountNamespace: team-a\n",
			want: ServiceAccount{Namespace: "team-a", Name: "deployer"}, wantUser: "system:serviceaccount:team-a:deployer"},
	} {
		r, err := parse(newLoader(tc.home, tc.def), tc.extra)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if r.Identity != tc.want {
			t.Errorf("%s: identity %+v, want %+v", tc.name, r.Identity, tc.want)
		}
		if tc.wantUser != "" && r.Identity.UserName() != tc.wantUser {
			t.Errorf("%s: user %q, want %q", tc.name, r.Identity.UserName(), tc.wantUser)
		}
		if tc.wantShown != "" && r.Identity.String() != tc.wantShown {
			t.Errorf("%s: shown as %q, want %q", tc.name, r.Identity.String(), tc.wantShown)
		}
	}
	// Who the rule acts as is not what it does: the hash stays with the
	// default.
	a, _ := parse(newLoader("", ServiceAccount{}), "")
	b, _ := parse(newLoader("", def), "")
	c, _ := parse(newLoader("", ServiceAccount{}), "  serviceAccountName: deployer\n")
	if a.Hash != b.Hash || a.Hash == c.Hash {
		t.Error("the hash follows the default identity, or not the rule's own")
	}

	l := newLoader("", ServiceAccount{})
	for _, tc := range []struct{ extra, want string }{
		{"  serviceAccountNamespace: team-a\n", `rule.yaml:9:28: rule "r": spec.serviceAccountNamespace: needs spec.serviceAccountName`},
		{"  serviceAccountName: Deployer\n", `rule.yaml:9:23: rule "r": spec.serviceAccountName: "Deployer" is not a valid ServiceAccount name`},
		{"  serviceAccountName: 7\n", `spec.serviceAccountName: must be a string, not a number`},
		{"  serviceAccountName: d\n  serviceAccountNamespace: a.b\n", `rule.yaml:10:28: rule "r": spec.serviceAccountNamespace: "a.b" is not a valid namespace`},
		{"  serviceAcountName: d\n", `unknown field "serviceAcountName" (did you mean "serviceAccountName"?)`},
	} {
		_, err := parse(l, tc.extra)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.extra, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"platform", "want NAMESPACE/NAME"},
		{"/rules", "want NAMESPACE/NAME"},
		{"Platform/rules", `namespace "Platform"`},
	} {
		if _, err := ParseServiceAccount(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseServiceAccount(%q): %v, want %q", tc.in, err, tc.want)
		}
	}
	if sa, err := ParseServiceAccount("platform/rules"); err != nil || sa != def {
		t.Errorf("ParseServiceAccount: %+v, %v", sa, err)
	}
}
