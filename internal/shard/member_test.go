package shard

import "testing"

// TestMemberStatus: a member says where it is — joining, handing over,
// or a member under the view it published — and is ready only when its
// published view is the group's members.
func TestMemberStatus(t *testing.T) {
	s, err := New(Config{Namespace: "ns", Group: "g", Identity: "A"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		members, published string
		ready              bool
		line               string
	}{
		{"a,b", "", false, "shard: joining group g as a (Lease ns/g-shard-a)"},
		{"a,b,c", "a,b", false, "shard: member a of group g, handing over: members [a,b,c], working under [a,b]"},
		{"a,b", "a,b", true, "shard: member a of group g, members [a,b]"},
	} {
		s.members, s.published = parseView(tc.members), parseView(tc.published)
		line, ready := s.Status()
		if line != tc.line || ready != tc.ready {
			t.Errorf("members %s, published %q: status %q ready %v, want %q ready %v", tc.members, tc.published, line, ready, tc.line, tc.ready)
		}
	}
}

// TestMemberName: an identity becomes a valid part of a Lease's name.
func TestMemberName(t *testing.T) {
	for in, want := range map[string]string{"pod-0": "pod-0", "Pod_1.example": "pod-1.example", "__": "member", "-a-": "a"} {
		if got := memberName(in); got != want {
			t.Errorf("memberName(%q) = %q, want %q", in, got, want)
		}
	}
	long := make([]byte, 260)
	for i := range long {
		long[i] = 'a'
	}
	if _, err := New(Config{Namespace: "ns", Group: "g", Identity: string(long)}); err == nil {
		t.Error("an identity making a Lease name over 253 characters was accepted")
	}
}
