// The line protocol, and nothing else: request lines out, reply lines in. No I/O here.

package ratelimitd

import (
	"fmt"
	"strconv"
	"strings"
)

// RequestError is the daemon rejecting the request itself (ERR PROTO, RULE, KEY, COST or
// TOO_LONG), or the client refusing to send one that cannot be valid: a bug in the
// caller, not an outage, so it is returned as an error instead of failing open.
type RequestError struct {
	Code    string
	Message string
}

func (e *RequestError) Error() string { return "ratelimitd: ERR " + e.Code + " " + e.Message }

// requestErrors are the ERR codes that mean the request is wrong.
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

// appendRequest writes "CHECK <rule> <key> <cost>\n"; a rule name or key that cannot
// be sent is a caller bug.
func appendRequest(b *strings.Builder, c Check) error {
	if c.Rule == "" {
		return &RequestError{Code: "RULE", Message: "empty rule name"}
	}
	for i := 0; i < len(c.Rule); i++ {
		if c.Rule[i] < 0x21 || c.Rule[i] > 0x7e {
			return &RequestError{Code: "RULE", Message: "rule name must be printable ASCII without spaces"}
		}
	}
	if c.Key == "" {
		return &RequestError{Code: "KEY", Message: "empty key"}
	}
	fmt.Fprintf(b, "CHECK %s %s %d\n", c.Rule, EncodeKey(c.Key), c.Cost)
	return nil
}

// ParseReply parses a CHECK reply: six fields or more; the seventh, window_ms, is
// optional (older daemons) and later ones are ignored. An ERR line is returned as a
// *RequestError whatever its code (the caller decides which codes are caller bugs);
// anything else unusable is a plain error.
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
	r := Result{Allowed: f[0] == "ALLOW", Limit: n[0], Remaining: n[1], ResetMs: n[2], WaitMs: n[3], Source: f[5], Rule: rule}
	if len(f) > 6 {
		if w, err := strconv.ParseUint(f[6], 10, 64); err == nil {
			r.WindowMs, r.HasWindow = w, true
		}
	}
	return r, nil
}
