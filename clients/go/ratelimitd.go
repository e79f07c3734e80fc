// Package ratelimitd is a client for ratelimitd, the per-host rate-limit daemon, with
// net/http middleware. Standard library only.
//
//	rl := ratelimitd.New("/run/ratelimitd/ratelimitd.sock")
//	r, err := rl.Check(ctx, "rides_request", "user:42", 1)
//	if err != nil { ... } // a malformed request (unknown rule, bad key or cost): a bug
//	if !r.Allowed { r.WriteHeaders(w.Header(), false); w.WriteHeader(429); return }
//
// A Client is safe for concurrent use: each call borrows a kept connection (or opens
// one) and gives it back; at most MaxIdle are kept. CheckMany pipelines several checks
// in one round trip. When the daemon is absent, refuses, answers ERR BUSY/PERM/INTERNAL
// or garbage, does not answer within Timeout, or ctx ends first, the result is allowed
// (FailOpen, the default; Source "client_fail_open") or denied ("client_fail_closed"),
// with the cause in Result.Err. A kept connection found closed (the daemon restarted)
// is retried once on a fresh one; a timeout never is.
package ratelimitd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// DefaultSocket is the daemon's default socket path.
const DefaultSocket = "/run/ratelimitd/ratelimitd.sock"

// Defaults for a Client's zero fields.
const (
	DefaultTimeout = 200 * time.Millisecond
	DefaultMaxIdle = 8
)

// Check is one request of CheckMany: Cost units (0 to 1,000,000; 0 only reports the
// state) of Key's budget under the configured rule Rule. Any key is fine: it is
// percent-encoded.
type Check struct {
	Rule string
	Key  string
	Cost uint32
}

// Client talks to one daemon. Set the fields before first use.
type Client struct {
	// Path of the daemon's socket.
	Path string
	// Timeout bounds each Check/CheckMany round trip, connecting included (a ctx
	// deadline, when sooner, wins). 0: DefaultTimeout.
	Timeout time.Duration
	// FailOpen allows (true) or denies (false) when the daemon cannot answer.
	FailOpen bool
	// MaxIdle is how many connections are kept between calls. 0: DefaultMaxIdle;
	// negative: none (each call opens its own).
	MaxIdle int

	pool pool
	// warned: the daemon could not be reached and that was logged (once per Client).
	warned sync.Once
}

// New returns a client for the socket at path: 200 ms timeout, fail-open, 8 kept
// connections.
func New(path string) *Client {
	return &Client{Path: path, Timeout: DefaultTimeout, FailOpen: true, MaxIdle: DefaultMaxIdle}
}

// Check asks for cost units of key's budget under rule. The error is non-nil only for a
// request that is malformed (*RequestError).
func (c *Client) Check(ctx context.Context, rule, key string, cost uint32) (Result, error) {
	rs, err := c.CheckMany(ctx, []Check{{Rule: rule, Key: key, Cost: cost}})
	if err != nil {
		return Result{}, err
	}
	return rs[0], nil
}

// CheckMany sends all checks in one write and reads their replies, in order. A
// *RequestError for any of them is returned as the error (the results are then nil);
// other failures give that check the fallback result and keep the others' replies.
func (c *Client) CheckMany(ctx context.Context, checks []Check) ([]Result, error) {
	if len(checks) == 0 {
		return nil, nil
	}
	var b strings.Builder
	for _, ch := range checks {
		if err := appendRequest(&b, ch); err != nil {
			return nil, err
		}
	}
	rules := make([]string, len(checks))
	for i, ch := range checks {
		rules[i] = ch.Rule
	}
	out, _, err := c.exchangeLines(ctx, []byte(b.String()), rules)
	return out, err
}

// exchangeLines sends payload (one request line per rule of rules), reads the replies
// and reads each as a CHECK reply under its rule, as CheckMany describes; the raw lines
// too (fewer than rules when the daemon did not answer them all).
func (c *Client) exchangeLines(ctx context.Context, payload []byte, rules []string) ([]Result, []string, error) {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	deadline := time.Now().Add(timeout)
	ctxFirst := false
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline, ctxFirst = d, true
	}
	lines := make([]string, 0, len(rules))
	cn := c.pool.take()
	reused := cn != nil
	var inStep bool
	var cause error
	if cn == nil {
		cn, cause = dial(ctx, c.Path, deadline)
	}
	if cause == nil {
		inStep, cause = cn.exchange(ctx, payload, len(rules), deadline, &lines)
	}
	if cause != nil && reused && len(lines) == 0 && !isTimeout(cause) && ctx.Err() == nil {
		// A kept connection closed by a daemon restart or an idle timeout (and so,
		// likely, every kept one): one retry on a fresh connection. Never after a
		// timeout: the daemon is alive but slow, and a retry would double the wait.
		cn.nc.Close()
		c.pool.drain()
		cn, cause = dial(ctx, c.Path, deadline)
		if cause == nil {
			inStep, cause = cn.exchange(ctx, payload, len(rules), deadline, &lines)
		}
	}
	if cause != nil {
		if err := ctx.Err(); err != nil {
			cause = err
		} else if ctxFirst && isTimeout(cause) {
			cause = context.DeadlineExceeded // the socket deadline was ctx's, a hair sooner
		}
		cause = fmt.Errorf("ratelimitd at %s: %w", c.Path, cause)
		if len(lines) == 0 && !reused {
			c.warnUnreachable(cause)
		}
	}
	out := make([]Result, len(rules))
	var bug error
	for i, rule := range rules {
		if i >= len(lines) {
			out[i] = c.fallback(rule, cause)
			continue
		}
		r, err := ParseReply(lines[i], rule)
		var re *RequestError
		switch {
		case err == nil:
			out[i] = r
		case errors.As(err, &re) && requestErrors[re.Code]:
			if bug == nil {
				bug = re
			}
		case re != nil:
			// BUSY and PERM close the connection; INTERNAL and codes of later versions
			// leave it open. Either way the daemon cannot serve this check now.
			inStep = inStep && re.Code != "BUSY" && re.Code != "PERM"
			out[i] = c.fallback(rule, fmt.Errorf("daemon said: %s", lines[i]))
		default:
			inStep = false
			out[i] = c.fallback(rule, err)
		}
	}
	if cn != nil {
		if cause == nil && inStep {
			c.pool.put(cn, c.maxIdle())
		} else {
			cn.nc.Close()
		}
	}
	if bug != nil {
		return nil, nil, bug
	}
	return out, lines, nil
}

func (c *Client) maxIdle() int {
	if c.MaxIdle == 0 {
		return DefaultMaxIdle
	}
	return c.MaxIdle
}

// Close closes the kept connections; later calls open new ones.
func (c *Client) Close() error {
	c.pool.drain()
	return nil
}

func (c *Client) fallback(rule string, err error) Result {
	src := "client_fail_closed"
	if c.FailOpen {
		src = "client_fail_open"
	}
	return Result{Allowed: c.FailOpen, Source: src, Rule: rule, Err: err}
}
