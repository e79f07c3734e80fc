package ratelimitd

// The client and the middleware against a real daemon (clients/testdaemon.sh; needs
// RATELIMITD_BIN): rule "api" is a token bucket of 5 that barely refills, "fast" never
// runs out.

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

type daemon struct {
	t      *testing.T
	dir    string
	socket string
}

func startDaemon(t *testing.T) *daemon {
	d := &daemon{t: t, dir: tempDir(t)}
	d.socket = filepath.Join(d.dir, "rl.sock")
	d.run("start")
	t.Cleanup(func() { d.run("resume"); d.run("stop") })
	return d
}

func (d *daemon) run(cmd string) {
	out, err := exec.Command("bash", "../testdaemon.sh", cmd, d.dir).CombinedOutput()
	if err != nil {
		d.t.Fatalf("testdaemon.sh %s: %v\n%s", cmd, err, out)
	}
}

func client(t *testing.T, path string, timeout time.Duration) *Client {
	c := New(path)
	c.Timeout = timeout
	t.Cleanup(func() { c.Close() })
	return c
}

func mustCheck(t *testing.T, c *Client, rule, key string, cost uint32) Result {
	t.Helper()
	r, err := c.Check(context.Background(), rule, key, cost)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestDaemonCountsDownDeniesAndMapsHeaders(t *testing.T) {
	d := startDaemon(t)
	c := client(t, d.socket, 5*time.Second)
	for left := uint64(4); ; left-- {
		r := mustCheck(t, c, "api", "go:count", 1)
		if !r.Allowed || r.Limit != 5 || r.Remaining != left || r.Source != "local" || r.Err != nil {
			t.Fatalf("want ALLOW 5 %d local, got %+v", left, r)
		}
		if left == 0 {
			break
		}
	}
	if n := c.pool.size(); n != 1 {
		t.Fatalf("%d kept connections, want 1 (reused)", n)
	}
	r := mustCheck(t, c, "api", "go:count", 1)
	if r.Allowed || r.WaitMs == 0 {
		t.Fatalf("want DENY, got %+v", r)
	}
	h := r.Headers(true)
	policy := `"api";q=5`
	if r.HasWindow { // capacity 5 at 0.001/s: 5000 s to refill
		policy += ";w=5000"
	}
	if h["RateLimit-Policy"] != policy || !regexp.MustCompile(`^"api";r=0;t=\d+$`).MatchString(h["RateLimit"]) ||
		h["X-RateLimit-Limit"] != "5" || h["X-RateLimit-Remaining"] != "0" || h["Retry-After"] == "" {
		t.Fatalf("headers: %v", h)
	}
	if _, ok := mustCheck(t, c, "api", "go:other", 1).Headers(false)["Retry-After"]; ok {
		t.Fatal("Retry-After on an ALLOW")
	}
}

func TestDaemonPipeliningKeepsOrder(t *testing.T) {
	d := startDaemon(t)
	c := client(t, d.socket, 5*time.Second)
	var checks []Check
	for i := 0; i < 7; i++ {
		checks = append(checks, Check{"api", "go:pipe", 1})
	}
	checks = append(checks, Check{"api", "go:pipe2", 2}, Check{"fast", "x", 0})
	rs, err := c.CheckMany(context.Background(), checks)
	if err != nil {
		t.Fatal(err)
	}
	want := []bool{true, true, true, true, true, false, false, true, true}
	for i, r := range rs {
		if r.Allowed != want[i] || (i < 5 && r.Remaining != uint64(4-i)) {
			t.Fatalf("reply %d: %+v", i, r)
		}
	}
	if rs[7].Remaining != 3 || rs[8].Limit != 1000000 || rs[8].Rule != "fast" {
		t.Fatalf("tail: %+v %+v", rs[7], rs[8])
	}
}

func TestDaemonCallerBugsAndEncodedKeys(t *testing.T) {
	d := startDaemon(t)
	c := client(t, d.socket, 5*time.Second)
	var re *RequestError
	for _, bad := range []Check{{"nope", "k", 1}, {"api", "k", 6}, {"two words", "k", 1}, {"api", "", 1}} {
		if _, err := c.Check(context.Background(), bad.Rule, bad.Key, bad.Cost); !errors.As(err, &re) {
			t.Fatalf("%+v: want a RequestError, got %v", bad, err)
		}
	}
	if _, err := c.Check(context.Background(), "nope", "k", 1); !errors.As(err, &re) || re.Code != "RULE" {
		t.Fatalf("want ERR RULE, got %v", err)
	}
	if r := mustCheck(t, c, "api", "user name/é\n", 1); !r.Allowed {
		t.Fatalf("%+v", r)
	}
	if r := mustCheck(t, c, "api", "user name/é", 0); r.Remaining != 5 {
		t.Fatalf("a different key: %+v", r)
	}
}

func TestDaemonFailsOpenWhileDownAndReconnects(t *testing.T) {
	d := startDaemon(t)
	c := client(t, d.socket, 5*time.Second)
	if r := mustCheck(t, c, "api", "k", 1); r.Source != "local" {
		t.Fatalf("%+v", r)
	}
	d.run("stop")
	if r := mustCheck(t, c, "api", "k", 1); r.Source != "client_fail_open" || r.Err == nil || !r.Allowed {
		t.Fatalf("%+v", r)
	}
	d.run("start")
	if r := mustCheck(t, c, "api", "k", 1); r.Source != "local" || r.Remaining != 4 {
		t.Fatalf("%+v", r)
	}
	d.run("stop")
	d.run("start")
	if r := mustCheck(t, c, "api", "k", 1); r.Source != "local" {
		t.Fatalf("a stale kept connection is retried once: %+v", r)
	}
}

func TestDaemonTimeoutAndContext(t *testing.T) {
	d := startDaemon(t)
	c := client(t, d.socket, 300*time.Millisecond)
	if r := mustCheck(t, c, "fast", "k", 1); r.Source != "local" {
		t.Fatalf("%+v", r)
	}
	d.run("pause")
	t0 := time.Now()
	r := mustCheck(t, c, "fast", "k", 1)
	if r.Source != "client_fail_open" || r.Err == nil || !strings.Contains(r.Err.Error(), "timeout") ||
		time.Since(t0) < 290*time.Millisecond || time.Since(t0) > 1500*time.Millisecond {
		t.Fatalf("%+v after %v", r, time.Since(t0))
	}
	closed := client(t, d.socket, 300*time.Millisecond)
	closed.FailOpen = false
	if r := mustCheck(t, closed, "fast", "k", 1); r.Source != "client_fail_closed" || r.Headers(false)["Retry-After"] != "1" {
		t.Fatalf("%+v", r)
	}
	// A context that ends sooner than Timeout wins, and says so.
	slow := client(t, d.socket, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	t0 = time.Now()
	r, _ = slow.Check(ctx, "fast", "k", 1)
	if r.Source != "client_fail_open" || !errors.Is(r.Err, context.DeadlineExceeded) || time.Since(t0) > time.Second {
		t.Fatalf("%+v after %v", r, time.Since(t0))
	}
	d.run("resume")
	if r := mustCheck(t, slow, "fast", "k", 1); r.Source != "local" {
		t.Fatalf("%+v", r)
	}
}

func TestDaemonGoroutinesShareOneClient(t *testing.T) {
	d := startDaemon(t)
	c := client(t, d.socket, 5*time.Second)
	c.MaxIdle = 4
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				if r := mustCheck(t, c, "fast", "g", 1); r.Source != "local" {
					t.Errorf("%+v", r)
				}
			}
			if mustCheck(t, c, "api", "go:shared", 1).Allowed {
				mu.Lock()
				allowed++
				mu.Unlock()
			}
		}(g)
	}
	wg.Wait()
	if allowed != 5 || c.pool.size() > 4 {
		t.Fatalf("%d allowed (want the bucket's 5), %d kept (max 4)", allowed, c.pool.size())
	}
}

func TestDaemonMiddlewareAnswers429WithHeaders(t *testing.T) {
	d := startDaemon(t)
	c := client(t, d.socket, 5*time.Second)
	limit := Middleware(c, func(r *http.Request) []Check {
		return []Check{{Rule: "api", Key: "ip:" + r.RemoteAddr[:strings.LastIndexByte(r.RemoteAddr, ':')], Cost: 1}}
	}, WithLegacyHeaders())
	srv := httptest.NewServer(limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := ResultFrom(r.Context()); !ok {
			t.Error("no result in the request context")
		}
		w.Write([]byte("hello\n"))
	})))
	defer srv.Close()
	var res *http.Response
	for i := 0; i < 6; i++ {
		var err error
		res, err = http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if i < 5 && (res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("RateLimit"), `"api";r=`)) {
			t.Fatalf("request %d: %d %v", i, res.StatusCode, res.Header)
		}
	}
	if res.StatusCode != http.StatusTooManyRequests || !strings.HasPrefix(res.Header.Get("RateLimit-Policy"), `"api";q=5`) ||
		!regexp.MustCompile(`^"api";r=0;t=\d+$`).MatchString(res.Header.Get("RateLimit")) ||
		res.Header.Get("Retry-After") == "" || res.Header.Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("6th request: %d %v", res.StatusCode, res.Header)
	}
}
