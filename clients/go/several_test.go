package ratelimitd

import (
	"bytes"
	"context"
	"log"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestDaemonCheckAllIsAllOrNothingAndNamesTheBindingRule(t *testing.T) {
	d := startDaemon(t)
	c := client(t, d.socket, 5*time.Second)
	ctx := context.Background()
	both := []Check{{Rule: "fast", Key: "go:all", Cost: 1}, {Rule: "api", Key: "go:all", Cost: 1}}
	for left := 4; left >= 0; left-- {
		r, err := c.CheckAll(ctx, both)
		if err != nil || !r.Allowed || r.Remaining != uint64(left) || r.Rule != "api" {
			t.Fatalf("%d left: %+v %v", left, r, err)
		}
	}
	r, err := c.CheckAll(ctx, both)
	if err != nil || r.Allowed || r.Rule != "api" {
		t.Fatalf("denied: %+v %v", r, err)
	}
	if _, err := c.CheckAll(ctx, nil); err == nil {
		t.Fatal("no checks: want a RequestError")
	}
	// Without Redis (this daemon) nothing is given back: the state after it.
	r, err = c.Refund(ctx, "api", "go:all", 2)
	if err != nil || !r.Allowed || r.Limit != 5 || r.Source != "local" {
		t.Fatalf("refund: %+v %v", r, err)
	}
}

func TestUnreachableDaemonIsLoggedOnceNamingThePath(t *testing.T) {
	var buf bytes.Buffer
	old := log.Writer()
	log.SetOutput(&buf)
	defer log.SetOutput(old)
	missing := filepath.Join(tempDir(t), "nothing.sock")
	c := client(t, missing, time.Second)
	for i := 0; i < 3; i++ {
		r := mustCheck(t, c, "api", "k", 1)
		if r.Source != "client_fail_open" {
			t.Fatalf("%+v", r)
		}
	}
	if n := strings.Count(buf.String(), "cannot reach"); n != 1 || !strings.Contains(buf.String(), missing) {
		t.Fatalf("%d warnings: %q", n, buf.String())
	}
}

func TestDaemonAllOrNothingMiddlewareTakesNothingWhenDenied(t *testing.T) {
	d := startDaemon(t)
	c := client(t, d.socket, 5*time.Second)
	mustCheck(t, c, "api", "go:mw:a", 3) // "a" has 2 left, "b" 5
	checks := []Check{{"api", "go:mw:a", 1}, {"fast", "go:mw:a", 1}, {"api", "go:mw:b", 1}}
	ran := 0
	h := Middleware(c, func(*http.Request) []Check { return checks }, WithAllOrNothing())(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran++ }))
	policy := regexp.MustCompile(`^"api";q=5;w=5000, "fast";q=1000000;w=\d+$`)
	for i, want := range []int{200, 200, 429, 429, 429} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		hd := rec.Header()
		if rec.Code != want || !policy.MatchString(hd.Get("RateLimit-Policy")) || !strings.HasPrefix(hd.Get("RateLimit"), `"api";r=`) {
			t.Fatalf("request %d: %d %v", i, rec.Code, hd)
		}
		if (want == 429) != (hd.Get("Retry-After") != "") {
			t.Fatalf("request %d: Retry-After %q", i, hd.Get("Retry-After"))
		}
	}
	if ran != 2 {
		t.Fatalf("the handler ran %d times, want 2", ran)
	}
	// Two allowed requests took 2 of b's 5; the three denied ones took nothing.
	if r := mustCheck(t, c, "api", "go:mw:b", 0); r.Remaining != 3 {
		t.Fatalf("b: %+v", r)
	}
}
