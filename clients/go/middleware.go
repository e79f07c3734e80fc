// net/http middleware: checks each request against ratelimitd, sets the rate-limit
// headers from the most restrictive result, and answers 429 itself when denied.

package ratelimitd

import (
	"context"
	"net/http"
)

// MiddlewareOption configures Middleware (WithLegacyHeaders, WithErrorHandler,
// WithAllOrNothing).
type MiddlewareOption func(*middleware)

// WithLegacyHeaders also sends X-RateLimit-Limit, -Remaining and -Reset.
func WithLegacyHeaders() MiddlewareOption { return func(m *middleware) { m.legacy = true } }

// WithErrorHandler replaces the answer to a *RequestError (a misconfigured rule, a cost
// above the limit): by default 500 Internal Server Error, and the handler does not run.
func WithErrorHandler(f func(http.ResponseWriter, *http.Request, error)) MiddlewareOption {
	return func(m *middleware) { m.onError = f }
}

type middleware struct {
	client  *Client
	checks  func(*http.Request) []Check
	legacy  bool
	onError func(http.ResponseWriter, *http.Request, error)

	allOrNothing bool
}

type ctxKey struct{}

// ResultFrom returns the result that set the headers of the request whose context this
// is (for a leaky_bucket's WaitMs, say), when the middleware ran.
func ResultFrom(ctx context.Context) (Result, bool) {
	r, ok := ctx.Value(ctxKey{}).(Result)
	return r, ok
}

// Middleware returns net/http middleware that makes checks(req) for each request (none:
// the request goes through unchecked). Denied: 429, the headers, a short text body, and
// next does not run. Allowed: the headers, then next. The middleware does not sleep for
// a leaky_bucket's WaitMs: read it with ResultFrom.
//
//	limit := ratelimitd.Middleware(rl, func(r *http.Request) []ratelimitd.Check {
//		return []ratelimitd.Check{{Rule: "api", Key: r.Header.Get("X-User"), Cost: 1}}
//	})
//	http.ListenAndServe(":8080", limit(mux))
func Middleware(c *Client, checks func(*http.Request) []Check, opts ...MiddlewareOption) func(http.Handler) http.Handler {
	m := &middleware{client: c, checks: checks, onError: func(w http.ResponseWriter, _ *http.Request, _ error) {
		http.Error(w, "rate limiter misconfigured", http.StatusInternalServerError)
	}}
	for _, o := range opts {
		o(m)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			wanted := m.checks(req)
			if len(wanted) == 0 {
				next.ServeHTTP(w, req)
				return
			}
			r, headers, err := m.decide(req, wanted)
			if err != nil {
				m.onError(w, req, err)
				return
			}
			for k, v := range headers {
				w.Header().Set(k, v)
			}
			if !r.Allowed {
				http.Error(w, "Too Many Requests", http.StatusTooManyRequests)
				return
			}
			next.ServeHTTP(w, req.WithContext(context.WithValue(req.Context(), ctxKey{}, r)))
		})
	}
}
