// Package render evaluates a loaded rule against one trigger: `when`, the
// lookups (through a Lookuper), the variables, then the resources in
// dependency order — each child rendered, given syncloop's marks, and
// brought about through an Applier, its readiness read from what the
// Applier returns — and the status and Ready condition. It decides whose
// an existing object is (Takeover: own, adopt, or a ConflictError), for
// the engine and the offline commands alike. It is a pure function of its
// arguments: the same code serves run, plan, render and test.
//
// It imports the front end (package rules) and nothing that reaches a
// cluster: the engine supplies the Applier, Lookuper and Scoper from its
// caches and writers, package offline supplies them from files. It does
// not parse rule files, write anything or hold state between renders.
package render
