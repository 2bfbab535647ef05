package rules

import (
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// Version is one version of the kind a rule defines: its schema, and how
// its objects convert to and from the version they are stored in.
type Version struct {
	Name string
	// Pos is where the version is written; field names it in errors
	// ("spec.api", or "spec.api.versions[1]").
	Pos   Pos
	field string
	// Served: clients may use it. Storage: objects are stored in it. Hub:
	// the other versions convert to and from it. Deprecated: the API
	// server warns each client that uses it, with Warning when set.
	Served, Storage, Hub, Deprecated bool
	Warning                          string
	// Spec is the schema of the version's spec, its validations included.
	Spec *spec.Schema
	// Columns are the printer columns the rule asked for; Ready and Age
	// follow them in the CRD.
	Columns []PrinterColumn
	// ToHub and FromHub convert an object between this version and the
	// hub; nil for the hub.
	ToHub, FromHub *Conversion
	// at is where the spec's fields are declared, by their path in the
	// object ("spec.ingress.host"), for the errors of a change.
	at map[string]Pos
	// validations are the nodes of the version's validations' rules,
	// for their errors.
	validations []*yaml.Node
	// defaults are the schema's defaults, built when the rule loads.
	defaults defaults
}

// defaults are a version's defaults: apply sets them in an object, as the
// API server does; spec is the default of a spec without required
// fields: {}, defaulted.
type defaults struct {
	apply func(obj map[string]any)
	spec  map[string]any
}

// FieldPos is where the spec field at path ("spec.ingress.host") is
// declared, or the nearest field above it that is; the version when none
// is.
func (v *Version) FieldPos(path string) Pos {
	for p := path; p != ""; {
		if pos, ok := v.at[p]; ok {
			return pos
		}
		i := strings.LastIndexByte(p, '.')
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return v.Pos
}

// Default sets the fields of obj that the version's schema defaults and
// obj leaves out, as the API server does when it reads or creates an
// object.
func (v *Version) Default(obj map[string]any) {
	if v.defaults.apply != nil {
		v.defaults.apply(obj)
	}
}

// VersionNamed is the version of the kind named name; nil when it has
// none.
func (a *API) VersionNamed(name string) *Version {
	for _, v := range a.Versions {
		if v.Name == name {
			return v
		}
	}
	return nil
}

// StorageVersion is the version objects are stored in.
func (a *API) StorageVersion() *Version {
	for _, v := range a.Versions {
		if v.Storage {
			return v
		}
	}
	return a.Versions[0]
}

// Hub is the version the others convert to and from: the one marked
// hub, or else the storage version.
func (a *API) Hub() *Version {
	for _, v := range a.Versions {
		if v.Hub {
			return v
		}
	}
	return a.StorageVersion()
}

// Converts reports whether the kind has more than one version: the API
// server then converts its objects through syncloop.
func (a *API) Converts() bool { return len(a.Versions) > 1 }

// decodeVersionFields decodes the schema of one version — spec, types,
// validations, printerColumns — from the fields f of the mapping n at
// field (format is its path in the rule format).
func (d *decoder) decodeVersionFields(v *Version, n *yaml.Node, f map[string]*yaml.Node, field, format string) {
	v.field, v.at = field, map[string]Pos{}
	if sn, ok := f["spec"]; !ok {
		d.errorf(n, field+".spec", "required: the fields of the kind's spec")
	} else {
		v.Spec = d.compileAPISchema(sn, field+".spec", f["types"], field+".types")
		d.apiFieldPositions(v, sn, "spec")
		if k, _ := entry(n, "spec"); k != nil {
			v.at["spec"] = d.pos(k)
		}
	}
	if vn, ok := f["validations"]; ok && v.Spec != nil {
		v.validations = d.decodeValidations(v.Spec, vn, field+".validations", format+".validations")
	}
	if cn, ok := f["printerColumns"]; ok {
		v.Columns = d.decodeColumns(cn, field+".printerColumns", format+".printerColumns")
	}
}

// decodeVersions decodes spec.api.versions (n) into a.Versions, and makes
// a.Version the one apiVersion names: the version the rule reads.
func (d *decoder) decodeVersions(a *API, n *yaml.Node) {
	const format = "spec.api.versions"
	items := d.seq(n, format)
	if len(items) == 0 {
		d.errorf(n, format, "lists no version: give one at least")
		return
	}
	for i, vn := range items {
		field := fmt.Sprintf("%s[%d]", format, i)
		f := d.fields(vn, field, RuleFormat.known(format)...)
		if f == nil {
			continue
		}
		v := &Version{Pos: d.pos(resolve(vn)), Served: true}
		if nn, ok := f["name"]; !ok {
			d.errorf(vn, field+".name", "required: the version, e.g. v1")
		} else if name, ok := d.str(nn, field+".name"); ok {
			v.Name = name
			switch {
			case len(validation.IsDNS1035Label(name)) > 0:
				d.errorf(nn, field+".name", "%q is not a version such as v1 or v1alpha1", name)
			case a.VersionNamed(name) != nil:
				d.errorf(nn, field+".name", "version %s is listed twice", name)
			}
		}
		for key, to := range map[string]*bool{"storage": &v.Storage, "hub": &v.Hub, "served": &v.Served, "deprecated": &v.Deprecated} {
			if bn, ok := f[key]; ok {
				if b, ok := d.boolean(bn, field+"."+key); ok {
					*to = b
				}
			}
		}
		if wn, ok := f["deprecationWarning"]; ok {
			v.Warning, _ = d.str(wn, field+".deprecationWarning")
			if !v.Deprecated {
				d.errorf(wn, field+".deprecationWarning", "only a deprecated version warns: add deprecated: true")
			}
		}
		d.decodeVersionFields(v, vn, f, field, format)
		a.Versions = append(a.Versions, v)
	}
	d.checkVersions(a, n)
}

// checkVersions checks the versions as a whole: one stored, the rule's
// own served, conversions where they must be.
func (d *decoder) checkVersions(a *API, n *yaml.Node) {
	var stored, hubs []string
	for _, v := range a.Versions {
		if v.Storage {
			stored = append(stored, v.Name)
		}
		if v.Hub {
			hubs = append(hubs, v.Name)
		}
	}
	if len(hubs) > 1 {
		d.errorf(n, "spec.api.versions", "versions %s are all marked hub: one version is the hub the others convert to and from", strings.Join(hubs, ", "))
	}
	switch {
	case len(a.Versions) == 1 && len(stored) == 0:
		a.Versions[0].Storage = true
	case len(stored) == 0:
		d.errorf(n, "spec.api.versions", "no version is the storage version: mark the one objects are stored in storage: true")
	case len(stored) > 1:
		d.errorf(n, "spec.api.versions", "versions %s are all marked storage: one version is the storage version", strings.Join(stored, ", "))
	}
	if a.GVK.Version == "" {
		return
	}
	a.Version = a.VersionNamed(a.GVK.Version)
	if a.Version == nil {
		var names []string
		for _, v := range a.Versions {
			names = append(names, v.Name)
		}
		d.errorAt(a.FieldPos("apiVersion"), "spec.api.apiVersion", "version %s is not among spec.api.versions (%s): apiVersion names the version the rule reads", a.GVK.Version, strings.Join(names, ", "))
		return
	}
	if !a.Version.Served {
		d.errorAt(a.FieldPos("apiVersion"), "spec.api.apiVersion", "version %s is not served: the rule reads the version apiVersion names, which must be served", a.GVK.Version)
	}
	if !slices.ContainsFunc(a.Versions, func(v *Version) bool { return v.Served }) {
		d.errorf(n, "spec.api.versions", "no version is served")
	}
}
