package dynamic

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// TestFastUnstructured: ConfigMaps and Secrets converted field by field
// equal the reflective converter's result, value types included, over
// generated objects that set, leave empty or leave out every field.
func TestFastUnstructured(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 3000 {
		var obj runtime.Object
		if i%2 == 0 {
			cm := &corev1.ConfigMap{ObjectMeta: genMeta(r)}
			cm.Immutable = genBool(r)
			cm.Data = genStrings(r)
			cm.BinaryData = genBytes(r)
			obj = cm
		} else {
			s := &corev1.Secret{ObjectMeta: genMeta(r)}
			s.Immutable = genBool(r)
			s.Data = genBytes(r)
			s.StringData = genStrings(r)
			if r.IntN(2) == 0 {
				s.Type = corev1.SecretTypeOpaque
			}
			obj = s
		}
		if r.IntN(3) == 0 { // as a JSON decode leaves it; protobuf's do not
			obj.GetObjectKind().SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind(reflect.TypeOf(obj).Elem().Name()))
		}
		want, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj.DeepCopyObject())
		if err != nil {
			t.Fatal(err)
		}
		wantU := &unstructured.Unstructured{Object: want}
		wantU.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind(reflect.TypeOf(obj).Elem().Name()))
		got, err := typedToUnstructured(obj, corev1.SchemeGroupVersion, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := fastUnstructured(obj); !ok {
			t.Fatalf("%T not converted field by field", obj)
		}
		if !reflect.DeepEqual(got.Object, wantU.Object) {
			t.Fatalf("object %d:\n got %#v\nwant %#v", i, got.Object, wantU.Object)
		}
	}
	// managedFields kept, and other kinds, go the converter's way.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}}}
	if _, ok := fastUnstructured(cm); ok {
		t.Error("a ConfigMap with managedFields converted field by field")
	}
	if _, ok := fastUnstructured(&corev1.Service{}); ok {
		t.Error("a Service converted field by field")
	}
}

// TestFastUnstructuredFields: the types converted field by field have the
// fields fastUnstructured knows; a k8s.io/api that adds one fails here
// rather than dropping it from every cached object.
func TestFastUnstructuredFields(t *testing.T) {
	for _, c := range []struct {
		v    any
		want int
	}{{metav1.ObjectMeta{}, 15}, {metav1.OwnerReference{}, 6}, {corev1.ConfigMap{}, 5}, {corev1.Secret{}, 6}} {
		if got := reflect.TypeOf(c.v).NumField(); got != c.want {
			t.Errorf("%T has %d fields, fastUnstructured knows %d: convert the new ones", c.v, got, c.want)
		}
	}
}

func genMeta(r *rand.Rand) metav1.ObjectMeta {
	//lint:ignore SA1019 a selfLink still sent must round-trip as any field
	m := metav1.ObjectMeta{Name: genString(r), GenerateName: genString(r), Namespace: genString(r), SelfLink: genString(r),
		UID: types.UID(genString(r)), ResourceVersion: genString(r), Labels: genStrings(r), Annotations: genStrings(r)}
	if r.IntN(2) == 0 {
		m.Generation = r.Int64N(5)
	}
	if r.IntN(3) != 0 {
		m.CreationTimestamp = metav1.NewTime(time.Unix(r.Int64N(2e9), 0))
	}
	if r.IntN(4) == 0 {
		d := metav1.NewTime(time.Unix(r.Int64N(2e9), 0))
		if r.IntN(3) == 0 {
			d = metav1.Time{}
		}
		m.DeletionTimestamp = &d
		g := r.Int64N(60)
		m.DeletionGracePeriodSeconds = &g
	}
	for range r.IntN(3) {
		m.OwnerReferences = append(m.OwnerReferences, metav1.OwnerReference{APIVersion: genString(r), Kind: genString(r),
			Name: genString(r), UID: types.UID(genString(r)), Controller: genBool(r), BlockOwnerDeletion: genBool(r)})
	}
	switch r.IntN(3) {
	case 0:
		m.Finalizers = []string{genString(r), genString(r)}
	case 1:
		m.Finalizers = []string{}
	}
	return m
}

func genString(r *rand.Rand) string {
	return []string{"", "a", "tenant-config", "ü \"quoted\"", "0"}[r.IntN(5)]
}

func genBool(r *rand.Rand) *bool {
	switch r.IntN(3) {
	case 0:
		return nil
	case 1:
		b := false
		return &b
	}
	b := true
	return &b
}

func genStrings(r *rand.Rand) map[string]string {
	switch r.IntN(3) {
	case 0:
		return nil
	case 1:
		return map[string]string{}
	}
	m := map[string]string{}
	for range 1 + r.IntN(3) {
		m[genString(r)+"k"] = genString(r)
	}
	return m
}

func genBytes(r *rand.Rand) map[string][]byte {
	switch r.IntN(3) {
	case 0:
		return nil
	case 1:
		return map[string][]byte{}
	}
	m := map[string][]byte{}
	for i := range 1 + r.IntN(3) {
		switch r.IntN(3) {
		case 0:
			m[fmt.Sprint(i)] = nil
		case 1:
			m[fmt.Sprint(i)] = []byte{}
		default:
			m[fmt.Sprint(i)] = []byte(genString(r) + "\x00\xff")
		}
	}
	return m
}
