// Headers of a request decided all or nothing (one CHECKALL): RateLimit names the
// binding rule, RateLimit-Policy lists every rule the request answered to.

package ratelimitd

import (
	"net/http"
	"strconv"
	"strings"
)

// WithAllOrNothing makes Middleware decide a request's checks as one CHECKALL (at most
// MaxTriples; no lease = "auto" or concurrency rule): a denied request takes nothing
// from any rule. RateLimit, Retry-After and the legacy trio come from the binding
// result, RateLimit-Policy lists every rule (AllOrNothingHeaders). When the checks name
// more than one rule, the round trip also carries one check of cost 0 per rule.
func WithAllOrNothing() MiddlewareOption { return func(m *middleware) { m.allOrNothing = true } }

// AllOrNothingHeaders returns the headers of a request decided by CheckAllPolicies:
// those of binding (see Headers), with RateLimit-Policy listing every distinct rule once
// in the order of the checks, joined by ", ": the binding rule's from binding, another's
// from its cost-0 result (left out when the client decided it). A binding rule that is
// none of the checks' rules (a composite rule's member) comes first.
func AllOrNothingHeaders(binding Result, policies []Result, legacy bool) map[string]string {
	h := binding.Headers(legacy)
	if binding.FromClient() {
		return h
	}
	names := []string{}
	byRule := map[string]Result{}
	for _, p := range policies {
		names = append(names, p.Rule)
		if !p.FromClient() {
			byRule[p.Rule] = p
		}
	}
	if !contains(names, binding.Rule) {
		names = append([]string{binding.Rule}, names...)
	}
	byRule[binding.Rule] = binding
	var parts []string
	for _, n := range names {
		if r, ok := byRule[n]; ok {
			parts = append(parts, policyItem(n, r))
		}
	}
	h["RateLimit-Policy"] = strings.Join(parts, ", ")
	return h
}

func policyItem(name string, r Result) string {
	p := `"` + name + `";q=` + strconv.FormatUint(r.Limit, 10)
	if r.HasWindow && r.WindowMs > 0 {
		p += ";w=" + strconv.FormatUint(ceilSeconds(r.WindowMs), 10)
	}
	return p
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// decide makes the middleware's checks: the result the request carries, its headers.
func (m *middleware) decide(req *http.Request, wanted []Check) (Result, map[string]string, error) {
	if m.allOrNothing {
		b, ps, err := m.client.CheckAllPolicies(req.Context(), wanted)
		return b, AllOrNothingHeaders(b, ps, m.legacy), err
	}
	rs, err := m.client.CheckMany(req.Context(), wanted)
	if err != nil {
		return Result{}, nil, err
	}
	r := MostRestrictive(rs)
	return r, r.Headers(m.legacy), nil
}
