package ratelimitd

// Unit tests of the pure parts: key encoding, reply parsing, request lines, the choice
// of the most restrictive result (the conformance table covers the rest end to end).

import (
	"errors"
	"strings"
	"testing"
)

func TestEncodeKey(t *testing.T) {
	for in, want := range map[string]string{
		"user:42":      "user:42",
		"user name/é%": "user%20name/%C3%A9%25",
		"a\nb\tc\x7f":  "a%0Ab%09c%7F",
	} {
		if got := EncodeKey(in); got != want {
			t.Errorf("EncodeKey(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseReply(t *testing.T) {
	r, err := ParseReply("DENY 20 0 1900 100 cache 2000 later", "rides")
	if err != nil || r.Allowed || r.Limit != 20 || r.WaitMs != 100 || r.Source != "cache" || !r.HasWindow || r.WindowMs != 2000 || r.Rule != "rides" {
		t.Fatalf("%+v %v", r, err)
	}
	if r, _ := ParseReply("ALLOW 1 1 0 0 redis", "x"); r.HasWindow {
		t.Fatal("six fields: no window")
	}
	if r, _ := ParseReply("ALLOW 1 1 0 0 redis soon", "x"); r.HasWindow {
		t.Fatal("a 7th field that is not a number: no window")
	}
	var re *RequestError
	if _, err := ParseReply("ERR RULE unknown rule x", "x"); !errors.As(err, &re) || re.Code != "RULE" || re.Message != "unknown rule x" {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "HELLO", "ALLOW 1 2 3 4", "ALLOW -1 1 0 0 redis", "MAYBE 1 1 0 0 redis"} {
		if _, err := ParseReply(bad, "x"); err == nil || errors.As(err, &re) {
			t.Errorf("%q: want a plain error, got %v", bad, err)
		}
	}
}

func TestRequestLines(t *testing.T) {
	var b strings.Builder
	if err := appendRequest(&b, Check{"api", "a b", 0}); err != nil || b.String() != "CHECK api a%20b 0\n" {
		t.Fatalf("%q %v", b.String(), err)
	}
	var re *RequestError
	for _, bad := range []Check{{"", "k", 1}, {"a b", "k", 1}, {"a\n", "k", 1}, {"api", "", 1}} {
		if err := appendRequest(&b, bad); !errors.As(err, &re) {
			t.Errorf("%+v: want a RequestError, got %v", bad, err)
		}
	}
}

func TestMostRestrictive(t *testing.T) {
	allow := func(rule string, limit, rem uint64) Result {
		return Result{Allowed: true, Limit: limit, Remaining: rem, Source: "redis", Rule: rule}
	}
	deny := func(rule string, wait uint64) Result {
		return Result{Limit: 1, WaitMs: wait, Source: "redis", Rule: rule}
	}
	clientDeny := Result{Source: "client_fail_closed", Rule: "c"}
	for _, tc := range []struct {
		rs   []Result
		want string
	}{
		{[]Result{allow("a", 10, 0), deny("b", 5)}, "b"},
		{[]Result{deny("a", 5), deny("b", 7)}, "b"},
		{[]Result{allow("a", 10, 3), allow("b", 10, 2)}, "b"},
		{[]Result{allow("a", 100, 2), allow("b", 10, 2)}, "a"}, // 2/100 < 2/10
		{[]Result{allow("a", 10, 2), allow("b", 10, 2)}, "a"},
		{[]Result{clientDeny, deny("d", 0)}, "d"},
		{[]Result{deny("d", 0), clientDeny}, "d"},
	} {
		if got := MostRestrictive(tc.rs).Rule; got != tc.want {
			t.Errorf("%+v: got %s, want %s", tc.rs, got, tc.want)
		}
	}
}
