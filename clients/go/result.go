// A decision, its HTTP headers (IETF draft-ietf-httpapi-ratelimit-headers, plus the
// legacy X-RateLimit-* trio on request), and the choice of the result that sets them
// when one request was checked against several rules.

package ratelimitd

import (
	"net/http"
	"strconv"
	"strings"
)

// Result is one decision. Times are in milliseconds.
type Result struct {
	Allowed   bool
	Limit     uint64 // the rule's limit (windows) or capacity (buckets)
	Remaining uint64
	ResetMs   uint64 // until the key is back to fully unused
	WaitMs    uint64 // DENY: until the same request could pass; ALLOW (leaky_bucket): wait before working
	// WindowMs is the rule's policy window (the reply's 7th field); HasWindow is false
	// when the daemon did not send it (older daemons) or the client decided.
	WindowMs  uint64
	HasWindow bool
	// Source is the daemon's word (redis, cache, local, lease, fail_open, fail_closed) or
	// the client's own: client_fail_open / client_fail_closed, with the cause in Err.
	Source string
	Rule   string
	Err    error
}

// FromClient is true when the daemon did not decide (the client failed open or closed).
func (r Result) FromClient() bool { return strings.HasPrefix(r.Source, "client_") }

// Headers returns the response headers for r. Daemon-decided:
// RateLimit-Policy: "<rule>";q=<limit>;w=<window s> (w omitted without a window),
// RateLimit: "<rule>";r=<remaining>;t=<reset s>, and when denied
// Retry-After: max(1, ceil(wait s)); with legacy also X-RateLimit-Limit, -Remaining and
// -Reset (seconds). Client fail-open: none; client fail-closed: Retry-After: 1.
func (r Result) Headers(legacy bool) map[string]string {
	h := map[string]string{}
	if r.FromClient() {
		if !r.Allowed {
			h["Retry-After"] = "1"
		}
		return h
	}
	reset := strconv.FormatUint(ceilSeconds(r.ResetMs), 10)
	policy := `"` + r.Rule + `";q=` + strconv.FormatUint(r.Limit, 10)
	if r.HasWindow && r.WindowMs > 0 {
		policy += ";w=" + strconv.FormatUint(ceilSeconds(r.WindowMs), 10)
	}
	h["RateLimit-Policy"] = policy
	h["RateLimit"] = `"` + r.Rule + `";r=` + strconv.FormatUint(r.Remaining, 10) + ";t=" + reset
	if !r.Allowed {
		retry := ceilSeconds(r.WaitMs)
		if retry < 1 {
			retry = 1
		}
		h["Retry-After"] = strconv.FormatUint(retry, 10)
	}
	if legacy {
		h["X-RateLimit-Limit"] = strconv.FormatUint(r.Limit, 10)
		h["X-RateLimit-Remaining"] = strconv.FormatUint(r.Remaining, 10)
		h["X-RateLimit-Reset"] = reset
	}
	return h
}

// WriteHeaders sets r's headers (see Headers) on h.
func (r Result) WriteHeaders(h http.Header, legacy bool) {
	for k, v := range r.Headers(legacy) {
		h.Set(k, v)
	}
}

func ceilSeconds(ms uint64) uint64 { return ms/1000 + boolToUint(ms%1000 != 0) }

func boolToUint(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// MostRestrictive picks the result that sets the headers when one request was checked
// against several rules: any denial beats any allowance; a daemon decision beats a
// client fallback of the same verdict; among denials the longest wait, among allowances
// the fewest remaining; then the lowest remaining/limit ratio (limit 0 counts as 0);
// then the first. rs must not be empty.
func MostRestrictive(rs []Result) Result {
	best := rs[0]
	for _, r := range rs[1:] {
		if stricter(r, best) {
			best = r
		}
	}
	return best
}

func stricter(a, b Result) bool {
	switch {
	case a.Allowed != b.Allowed:
		return !a.Allowed
	case a.FromClient() != b.FromClient():
		return !a.FromClient()
	case !a.Allowed && a.WaitMs != b.WaitMs:
		return a.WaitMs > b.WaitMs
	case a.Allowed && a.Remaining != b.Remaining:
		return a.Remaining < b.Remaining
	}
	return ratio(a) < ratio(b)
}

func ratio(r Result) float64 {
	if r.Limit == 0 {
		return 0
	}
	return float64(r.Remaining) / float64(r.Limit)
}
