// Concurrency slots (algorithm = "concurrency" rules): Acquire, Release, WithSlot
// (runs a function holding a slot and always gives it back) and a net/http middleware
// holding one slot per request.
//
// A Slot keeps the connection that took it until it is released: the daemon gives a
// slot back when that connection closes, so a process that dies frees its slots at
// once; the rule's max_hold ends any slot held too long. A slot the client could not
// ask about (daemon absent, slow, overloaded) follows FailOpen: allowed without a
// token, or denied, with the cause in Err.

package ratelimitd

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Slot is one ACQUIRE's answer.
type Slot struct {
	Allowed   bool
	Rule, Key string
	Limit     uint64
	Remaining uint64
	// WaitMs on a denial: until the oldest slot held ends its max_hold.
	WaitMs uint64
	Source string
	// Token names the slot for Release ("" when denied or decided by the client).
	Token string
	Err   error

	c  *Client
	cn *conn
}

// Headers are RateLimit-Policy: "<rule>";q=<limit>;qu="concurrent-requests",
// RateLimit and, when denied, Retry-After (none when the client failed open).
func (s *Slot) Headers() map[string]string {
	if strings.HasPrefix(s.Source, "client_") {
		if s.Allowed {
			return map[string]string{}
		}
		return map[string]string{"Retry-After": "1"}
	}
	h := map[string]string{
		"RateLimit-Policy": fmt.Sprintf("%q;q=%d;qu=\"concurrent-requests\"", s.Rule, s.Limit),
		"RateLimit":        fmt.Sprintf("%q;r=%d", s.Rule, s.Remaining),
	}
	if !s.Allowed {
		h["Retry-After"] = strconv.FormatUint(max(1, ceilSeconds(s.WaitMs)), 10)
	}
	return h
}

// ask sends one line on cn and reads one reply.
func (c *Client) ask(ctx context.Context, cn *conn, line string) (string, error) {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var lines []string
	if _, err := cn.exchange(ctx, []byte(line), 1, deadline, &lines); err != nil {
		return "", err
	}
	return lines[0], nil
}

func refused(line string) error {
	f := strings.SplitN(line, " ", 3)
	if len(f) >= 2 && f[0] == "ERR" && requestErrors[f[1]] {
		msg := ""
		if len(f) == 3 {
			msg = f[2]
		}
		return &RequestError{Code: f[1], Message: msg}
	}
	return nil
}

// Acquire takes a slot of rule for key (ACQUIRE). The error is non-nil only for a
// request that is malformed (*RequestError: unknown rule, not a concurrency rule, bad
// key). An allowed Slot holds a connection until Release.
func (c *Client) Acquire(ctx context.Context, rule, key string) (*Slot, error) {
	k := EncodeKey(key)
	s := &Slot{Rule: rule, Key: k, c: c}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	cn := c.pool.take()
	var err error
	if cn == nil {
		cn, err = dial(ctx, c.Path, time.Now().Add(timeout))
	}
	var line string
	if err == nil {
		line, err = c.ask(ctx, cn, "ACQUIRE "+rule+" "+k+"\n")
	}
	if err == nil {
		if bug := refused(line); bug != nil {
			c.pool.put(cn, c.maxIdle())
			return nil, bug
		}
		f := strings.Split(line, " ")
		n := make([]uint64, 0, 4)
		for _, x := range f[1:min(5, len(f))] {
			if v, e := strconv.ParseUint(x, 10, 64); e == nil {
				n = append(n, v)
			}
		}
		ok := len(f) >= 6 && len(n) == 4 && (f[0] == "DENY" || (f[0] == "ALLOW" && len(f) >= 8))
		if ok {
			s.Allowed, s.Limit, s.Remaining, s.WaitMs, s.Source = f[0] == "ALLOW", n[0], n[1], n[3], f[5]
			if s.Allowed {
				s.Token, s.cn = f[7], cn
			} else {
				c.pool.put(cn, c.maxIdle())
			}
			return s, nil
		}
		err = fmt.Errorf("unexpected reply: %.80s", line)
	}
	if cn != nil {
		cn.nc.Close()
	}
	s.Allowed, s.Err = c.FailOpen, fmt.Errorf("ratelimitd at %s: %w", c.Path, err)
	s.Source = "client_fail_closed"
	if c.FailOpen {
		s.Source = "client_fail_open"
	}
	return s, nil
}

// Release gives the slot back (RELEASE on the connection that took it, which then
// returns to the pool). True when the daemon held it; false when it no longer did (its
// max_hold ended) or could not be asked. Safe to call more than once.
func (s *Slot) Release(ctx context.Context) bool {
	cn, token := s.cn, s.Token
	s.cn, s.Token = nil, ""
	if cn == nil || token == "" {
		return false
	}
	line, err := s.c.ask(ctx, cn, "RELEASE "+s.Rule+" "+s.Key+" "+token+"\n")
	if err != nil {
		cn.nc.Close() // the daemon gives the slot back when it sees the close
		return false
	}
	s.c.pool.put(cn, s.c.maxIdle())
	return line == "OK"
}

// WithSlot runs fn holding a slot of rule for key, and releases it when fn returns or
// panics; fn sees slot.Allowed. The error is Acquire's or fn's.
func (c *Client) WithSlot(ctx context.Context, rule, key string, fn func(*Slot) error) error {
	s, err := c.Acquire(ctx, rule, key)
	if err != nil {
		return err
	}
	defer s.Release(context.WithoutCancel(ctx))
	return fn(s)
}

// ConcurrencyMiddleware holds one slot of rule per request (key(r); "" skips it) while
// the handler runs, released when it returns or panics (a client that disconnects
// cancels r.Context(); the handler's return releases the slot). A denied request gets
// 429 with the headers and never reaches the handler; a *RequestError is a 500.
func ConcurrencyMiddleware(c *Client, rule string, key func(*http.Request) string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			k := key(r)
			if k == "" {
				next.ServeHTTP(w, r)
				return
			}
			s, err := c.Acquire(r.Context(), rule, k)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			defer s.Release(context.WithoutCancel(r.Context()))
			for name, v := range s.Headers() {
				w.Header().Set(name, v)
			}
			if !s.Allowed {
				http.Error(w, "Too many requests in progress", http.StatusTooManyRequests)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}
