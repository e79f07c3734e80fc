// Headers of a request checked against several rules, pipelined (CheckMany) or all or
// nothing (one CHECKALL): RateLimit names the binding or most restrictive rule,
// RateLimit-Policy lists every rule the request answered to.

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
// those of binding (see Headers), with RateLimit-Policy listing every rule (see
// ResponseHeaders) from binding and the cost-0 results.
func AllOrNothingHeaders(binding Result, policies []Result, legacy bool) map[string]string {
	h := binding.Headers(legacy)
	if !binding.FromClient() {
		h["RateLimit-Policy"] = policyList(binding, policies)
	}
	return h
}

// ResponseHeaders returns the headers of a request checked against rs (CheckMany):
// RateLimit, Retry-After and the legacy trio from MostRestrictive(rs) (see Headers), and
// RateLimit-Policy listing every distinct rule of rs once, in order, joined by ", ": the
// most restrictive result's rule from it, another's from its first daemon-decided result
// (a rule with none is left out).
func ResponseHeaders(rs []Result, legacy bool) map[string]string {
	if len(rs) == 0 {
		return map[string]string{}
	}
	r := MostRestrictive(rs)
	h := r.Headers(legacy)
	if !r.FromClient() {
		h["RateLimit-Policy"] = policyList(r, rs)
	}
	return h
}

// policyList is the RateLimit-Policy value for binding among results. A binding rule that
// is none of theirs (a composite rule's member) comes first.
func policyList(binding Result, results []Result) string {
	names := []string{}
	first := map[string]Result{binding.Rule: binding}
	for _, r := range results {
		if !contains(names, r.Rule) {
			names = append(names, r.Rule)
		}
		if _, ok := first[r.Rule]; !ok && !r.FromClient() {
			first[r.Rule] = r
		}
	}
	if !contains(names, binding.Rule) {
		names = append([]string{binding.Rule}, names...)
	}
	var parts []string
	for _, n := range names {
		if r, ok := first[n]; ok {
			parts = append(parts, policyItem(n, r))
		}
	}
	return strings.Join(parts, ", ")
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
	return MostRestrictive(rs), ResponseHeaders(rs, m.legacy), nil
}
