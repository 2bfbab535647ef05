// Package webhook serves the conversion webhook of the kinds rules define
// in several versions (rules.API.Convert): the API server posts a
// ConversionReview to /convert for every read and write in a version other
// than the stored one, so every replica of syncloop serves it, whether or
// not it runs the rules. A conversion is a pure function of the compiled
// rules: it never waits on the API server. The package also keeps the
// webhook's serving certificate and the CA the CRDs trust, in a Secret of
// syncloop's namespace.
//
// It does not know how rules are loaded, nor who applies the CRDs: the
// manager hands it each rule set put in force and reads its CA bundle.
package webhook
