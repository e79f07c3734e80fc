package ratelimitd

// Several limits in one request (CHECKALL: all or nothing), refunds, and the one
// warning a Client logs when it cannot reach the daemon.

import (
	"context"
	"fmt"
	"log"
	"strings"
)

// MaxTriples is the most checks one CheckAll may carry.
const MaxTriples = 8

// CheckAll asks for 1 to 8 checks as one request: allowed only if every one is, and
// then each is taken; on a deny none is. The result is the binding check's (on a deny
// the one with the longest wait, on an allow the one with the fewest remaining relative
// to its limit), its Rule naming it. The error is non-nil only for a malformed request.
func (c *Client) CheckAll(ctx context.Context, checks []Check) (Result, error) {
	r, _, err := c.checkAll(ctx, checks, nil)
	return r, err
}

// CheckAllPolicies is CheckAll plus, in the same round trip, one check of cost 0 (it
// takes nothing) per distinct rule, when the checks name more than one: the binding
// result and each rule's state, in the order the rules first appear, for
// AllOrNothingHeaders to list every policy. A policy that could not be read is a
// client-decided result (left out of the headers).
func (c *Client) CheckAllPolicies(ctx context.Context, checks []Check) (Result, []Result, error) {
	first := map[string]bool{}
	var asks []Check
	for _, ch := range checks {
		if !first[ch.Rule] {
			first[ch.Rule] = true
			asks = append(asks, Check{Rule: ch.Rule, Key: ch.Key, Cost: 0})
		}
	}
	if len(asks) < 2 {
		asks = nil
	}
	return c.checkAll(ctx, checks, asks)
}

func (c *Client) checkAll(ctx context.Context, checks, asks []Check) (Result, []Result, error) {
	if len(checks) < 1 || len(checks) > MaxTriples {
		return Result{}, nil, &RequestError{Code: "PROTO", Message: fmt.Sprintf("CheckAll takes 1 to %d checks", MaxTriples)}
	}
	var one, payload strings.Builder
	line := "CHECKALL"
	for _, ch := range checks {
		one.Reset()
		if err := appendRequest(&one, ch); err != nil {
			return Result{}, nil, err
		}
		// "CHECK <rule> <key> <cost>\n" → " <rule> <key> <cost>"
		line += strings.TrimSuffix(strings.TrimPrefix(one.String(), "CHECK"), "\n")
	}
	payload.WriteString(line + "\n")
	rules := []string{checks[0].Rule}
	for _, ch := range asks {
		if err := appendRequest(&payload, ch); err != nil {
			return Result{}, nil, err
		}
		rules = append(rules, ch.Rule)
	}
	rs, lines, err := c.exchangeLines(ctx, []byte(payload.String()), rules)
	if err != nil {
		return Result{}, nil, err
	}
	r := rs[0]
	if len(lines) > 0 && !strings.HasPrefix(r.Source, "client_") {
		if f := strings.Fields(lines[0]); len(f) >= 8 {
			r.Rule = f[7] // the binding rule, after window_ms
		}
	}
	return r, rs[1:], nil
}

// Refund gives up to units back to key under rule (never beyond the rule's limit);
// the result is the key's state after it.
func (c *Client) Refund(ctx context.Context, rule, key string, units uint32) (Result, error) {
	var b strings.Builder
	if err := appendRequest(&b, Check{Rule: rule, Key: key, Cost: units}); err != nil {
		return Result{}, err
	}
	line := "REFUND" + strings.TrimPrefix(b.String(), "CHECK")
	rs, _, err := c.exchangeLines(ctx, []byte(line), []string{rule})
	if err != nil {
		return Result{}, err
	}
	return rs[0], nil
}

// warnUnreachable logs once per Client that the daemon at Path could not be reached:
// a wrong path must not pass silently while every call fails open.
func (c *Client) warnUnreachable(cause error) {
	c.warned.Do(func() {
		mode := "closed"
		if c.FailOpen {
			mode = "open"
		}
		log.Printf("ratelimitd: cannot reach the daemon at %s (%v); every call fails %s until it can", c.Path, cause, mode)
	})
}
