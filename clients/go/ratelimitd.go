// Package ratelimitd is a client for ratelimitd, the per-host rate-limit daemon
// (standard library only).
//
//	rl := ratelimitd.New("/run/ratelimitd/ratelimitd.sock")
//	r, err := rl.Check("rides_request", "user:42", 1)
//	if err != nil { ... } // a malformed request (unknown rule, bad key or cost): a bug
//	if !r.Allowed { r.WriteHeaders(w.Header()); w.WriteHeader(429); return }
//
// One connection per Client, opened on first use and reused (a mutex serialises
// requests; CheckMany pipelines several in one round trip), re-opened after the daemon
// restarts. When the daemon is absent, refuses, or does not answer within Timeout, the
// result is allowed (FailOpen, the default; Source "client_fail_open") or denied
// (Source "client_fail_closed"), with the cause in Result.Err.
package ratelimitd

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultSocket is the daemon's default socket path.
const DefaultSocket = "/run/ratelimitd/ratelimitd.sock"

// Result is one decision. Times are in milliseconds. Source is the daemon's (redis,
// cache, local, fail_open, fail_closed) or the client's own (client_fail_open,
// client_fail_closed, with Err saying why).
type Result struct {
	Allowed   bool
	Limit     uint64
	Remaining uint64
	ResetMs   uint64
	WaitMs    uint64
	Source    string
	Rule      string
	Err       error
}

// FromClient is true when the daemon did not decide (the client failed open or closed).
func (r Result) FromClient() bool { return strings.HasPrefix(r.Source, "client_") }

// Headers returns the HTTP response headers for r: IETF
// draft-ietf-httpapi-ratelimit-headers (RateLimit-Policy, RateLimit), the common
// X-RateLimit-Limit/Remaining/Reset (seconds from now), and Retry-After (seconds) when
// denied. Empty when the daemon did not decide (Retry-After: 1 if the client failed
// closed).
func (r Result) Headers() map[string]string {
	if r.FromClient() {
		if r.Allowed {
			return map[string]string{}
		}
		return map[string]string{"Retry-After": "1"}
	}
	reset := ceilSeconds(r.ResetMs)
	h := map[string]string{
		"RateLimit-Policy":      fmt.Sprintf("%q;q=%d", r.Rule, r.Limit),
		"RateLimit":             fmt.Sprintf("%q;r=%d;t=%d", r.Rule, r.Remaining, reset),
		"X-RateLimit-Limit":     strconv.FormatUint(r.Limit, 10),
		"X-RateLimit-Remaining": strconv.FormatUint(r.Remaining, 10),
		"X-RateLimit-Reset":     strconv.FormatUint(reset, 10),
	}
	if !r.Allowed {
		retry := ceilSeconds(r.WaitMs)
		if retry < 1 {
			retry = 1
		}
		h["Retry-After"] = strconv.FormatUint(retry, 10)
	}
	return h
}

// WriteHeaders sets r's headers (see Headers) on h.
func (r Result) WriteHeaders(h http.Header) {
	for k, v := range r.Headers() {
		h.Set(k, v)
	}
}

func ceilSeconds(ms uint64) uint64 { return (ms + 999) / 1000 }

// RequestError is the daemon rejecting the request itself (ERR PROTO, RULE, KEY, COST
// or TOO_LONG): a bug in the caller, not an outage.
type RequestError struct {
	Code    string
	Message string
}

func (e *RequestError) Error() string { return "ratelimitd: ERR " + e.Code + " " + e.Message }

var requestErrors = map[string]bool{"PROTO": true, "RULE": true, "KEY": true, "COST": true, "TOO_LONG": true}

// EncodeKey percent-encodes every byte outside 0x21..0x7E, and '%' itself.
func EncodeKey(key string) string {
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c >= 0x21 && c <= 0x7e && c != '%' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// ParseReply parses a CHECK reply: six fields, extra trailing fields ignored. An ERR
// line is returned as a *RequestError.
func ParseReply(line, rule string) (Result, error) {
	f := strings.Fields(line)
	if len(f) > 0 && f[0] == "ERR" {
		e := &RequestError{Code: "INTERNAL"}
		if len(f) > 1 {
			e.Code, e.Message = f[1], strings.Join(f[2:], " ")
		}
		return Result{}, e
	}
	if len(f) < 6 || (f[0] != "ALLOW" && f[0] != "DENY") {
		return Result{}, fmt.Errorf("ratelimitd: unexpected reply %q", line)
	}
	var n [4]uint64
	for i := range n {
		v, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return Result{}, fmt.Errorf("ratelimitd: bad number in reply %q", line)
		}
		n[i] = v
	}
	return Result{Allowed: f[0] == "ALLOW", Limit: n[0], Remaining: n[1], ResetMs: n[2], WaitMs: n[3], Source: f[5], Rule: rule}, nil
}

// Check is one request of CheckMany. Cost 0 takes nothing and reports the state.
type Check struct {
	Rule string
	Key  string
	Cost uint32
}

// Client is a connection to the daemon, safe for concurrent use.
type Client struct {
	// Path of the daemon's socket.
	Path string
	// Timeout bounds each Check/CheckMany round trip, connecting included.
	Timeout time.Duration
	// FailOpen allows (true) or denies (false) when the daemon cannot answer.
	FailOpen bool

	mu   sync.Mutex
	conn net.Conn
	rd   *bufio.Reader
}

// New returns a client for the socket at path with a 200 ms timeout, failing open.
func New(path string) *Client {
	return &Client{Path: path, Timeout: 200 * time.Millisecond, FailOpen: true}
}

// Check asks for cost units of key's budget under rule. The error is non-nil only for a
// request the daemon rejects as malformed (*RequestError).
func (c *Client) Check(rule, key string, cost uint32) (Result, error) {
	rs, err := c.CheckMany([]Check{{Rule: rule, Key: key, Cost: cost}})
	if err != nil {
		return Result{}, err
	}
	return rs[0], nil
}

// CheckMany sends all checks in one write and reads their replies, in order.
func (c *Client) CheckMany(checks []Check) ([]Result, error) {
	if len(checks) == 0 {
		return nil, nil
	}
	var b strings.Builder
	for _, ch := range checks {
		fmt.Fprintf(&b, "CHECK %s %s %d\n", ch.Rule, EncodeKey(ch.Key), ch.Cost)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	lines, err := c.roundTrip([]byte(b.String()), len(checks))
	if err != nil {
		c.closeLocked()
		return c.fallback(checks, err), nil
	}
	out := make([]Result, len(checks))
	for i, line := range lines {
		r, err := ParseReply(line, checks[i].Rule)
		var re *RequestError
		switch {
		case errors.As(err, &re) && requestErrors[re.Code]:
			return nil, re
		case re != nil:
			// BUSY, PERM, INTERNAL: the daemon cannot serve us now (and closes the
			// connection after BUSY or PERM).
			c.closeLocked()
			out[i] = c.fallback(checks[i:i+1], fmt.Errorf("daemon said: %s", line))[0]
		case err != nil:
			c.closeLocked()
			return nil, err
		default:
			out[i] = r
		}
	}
	return out, nil
}

// Close closes the connection; the next check opens a new one.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeLocked()
	return nil
}

func (c *Client) fallback(checks []Check, err error) []Result {
	src := "client_fail_closed"
	if c.FailOpen {
		src = "client_fail_open"
	}
	out := make([]Result, len(checks))
	for i, ch := range checks {
		out[i] = Result{Allowed: c.FailOpen, Source: src, Rule: ch.Rule, Err: err}
	}
	return out
}

func (c *Client) closeLocked() {
	if c.conn != nil {
		c.conn.Close()
		c.conn, c.rd = nil, nil
	}
}

func (c *Client) roundTrip(payload []byte, n int) ([]string, error) {
	deadline := time.Now().Add(c.Timeout)
	reused := c.conn != nil
	lines, err := c.exchange(payload, n, deadline)
	var ne net.Error
	if err != nil && reused && !(errors.As(err, &ne) && ne.Timeout()) {
		// A kept connection closed by a daemon restart or idle timeout: one retry on a
		// fresh connection (not after a timeout: the daemon is alive but slow).
		c.closeLocked()
		lines, err = c.exchange(payload, n, deadline)
	}
	return lines, err
}

func (c *Client) exchange(payload []byte, n int, deadline time.Time) ([]string, error) {
	if c.conn == nil {
		conn, err := net.DialTimeout("unix", c.Path, time.Until(deadline))
		if err != nil {
			return nil, err
		}
		c.conn, c.rd = conn, bufio.NewReader(conn)
	}
	if err := c.conn.SetDeadline(deadline); err != nil {
		return nil, err
	}
	if _, err := c.conn.Write(payload); err != nil {
		return nil, err
	}
	lines := make([]string, 0, n)
	for len(lines) < n {
		line, err := c.rd.ReadString('\n')
		if err != nil {
			return nil, err
		}
		lines = append(lines, strings.TrimSuffix(line, "\n"))
	}
	return lines, nil
}
