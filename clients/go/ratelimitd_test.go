package ratelimitd

// Tests against a real daemon (clients/run_tests.sh runs them; needs RATELIMITD_BIN).

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

type daemon struct {
	t      *testing.T
	dir    string
	socket string
}

func startDaemon(t *testing.T) *daemon {
	dir, err := os.MkdirTemp(os.Getenv("RL_TEST_ROOT"), "rl-go-")
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, dir: dir, socket: filepath.Join(dir, "rl.sock")}
	d.run("start")
	t.Cleanup(func() { d.run("resume"); d.run("stop"); os.RemoveAll(dir) })
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
	r, err := c.Check(rule, key, cost)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestCountsDownDeniesAndMapsHeaders(t *testing.T) {
	d := startDaemon(t)
	c := client(t, d.socket, 5*time.Second)
	for left := uint64(4); ; left-- {
		r := mustCheck(t, c, "api", "go:count", 1)
		if !r.Allowed || r.Limit != 5 || r.Remaining != left || r.Source != "local" {
			t.Fatalf("want ALLOW 5 %d local, got %+v", left, r)
		}
		if left == 0 {
			break
		}
	}
	conn := c.conn
	r := mustCheck(t, c, "api", "go:count", 1)
	if c.conn != conn {
		t.Fatal("connection not reused")
	}
	if r.Allowed || r.WaitMs == 0 {
		t.Fatalf("want DENY, got %+v", r)
	}
	h := r.Headers()
	if h["RateLimit-Policy"] != `"api";q=5` || !regexp.MustCompile(`^"api";r=0;t=\d+$`).MatchString(h["RateLimit"]) ||
		h["X-RateLimit-Limit"] != "5" || h["X-RateLimit-Remaining"] != "0" || h["Retry-After"] == "" {
		t.Fatalf("headers: %v", h)
	}
	if _, ok := mustCheck(t, c, "api", "go:other", 1).Headers()["Retry-After"]; ok {
		t.Fatal("Retry-After on an ALLOW")
	}
}

func TestPipeliningKeepsOrder(t *testing.T) {
	d := startDaemon(t)
	c := client(t, d.socket, 5*time.Second)
	var checks []Check
	for i := 0; i < 7; i++ {
		checks = append(checks, Check{"api", "go:pipe", 1})
	}
	checks = append(checks, Check{"api", "go:pipe2", 2}, Check{"fast", "x", 0})
	rs, err := c.CheckMany(checks)
	if err != nil {
		t.Fatal(err)
	}
	want := []bool{true, true, true, true, true, false, false, true, true}
	for i, r := range rs {
		if r.Allowed != want[i] {
			t.Fatalf("reply %d: %+v", i, r)
		}
		if i < 5 && r.Remaining != uint64(4-i) {
			t.Fatalf("reply %d remaining %d", i, r.Remaining)
		}
	}
	if rs[7].Remaining != 3 || rs[8].Limit != 1000000 || rs[8].Rule != "fast" {
		t.Fatalf("tail: %+v %+v", rs[7], rs[8])
	}
}

func TestRequestErrorsEncodingAndExtraFields(t *testing.T) {
	d := startDaemon(t)
	c := client(t, d.socket, 5*time.Second)
	var re *RequestError
	if _, err := c.Check("nope", "k", 1); !errors.As(err, &re) || re.Code != "RULE" {
		t.Fatalf("want ERR RULE, got %v", err)
	}
	if _, err := c.Check("api", "k", 6); !errors.As(err, &re) || re.Code != "COST" {
		t.Fatalf("want ERR COST, got %v", err)
	}
	if r := mustCheck(t, c, "api", "user name/é", 1); !r.Allowed {
		t.Fatalf("%+v", r)
	}
	if got := EncodeKey("user name/é%"); got != "user%20name/%C3%A9%25" {
		t.Fatal(got)
	}
	r, err := ParseReply("DENY 20 0 1900 100 cache future fields", "rides")
	if err != nil || r != (Result{false, 20, 0, 1900, 100, "cache", "rides", nil}) {
		t.Fatalf("%+v %v", r, err)
	}
}

func TestFailOpenAndClosedWhenAbsent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "none.sock")
	r := mustCheck(t, client(t, path, 200*time.Millisecond), "api", "k", 1)
	if !r.Allowed || r.Source != "client_fail_open" || r.Err == nil || len(r.Headers()) != 0 {
		t.Fatalf("%+v", r)
	}
	cl := client(t, path, 200*time.Millisecond)
	cl.FailOpen = false
	r = mustCheck(t, cl, "api", "k", 1)
	if r.Allowed || r.Source != "client_fail_closed" || r.Headers()["Retry-After"] != "1" {
		t.Fatalf("%+v", r)
	}
}

func TestReconnectsAfterRestart(t *testing.T) {
	d := startDaemon(t)
	c := client(t, d.socket, 5*time.Second)
	if r := mustCheck(t, c, "api", "k", 1); r.Source != "local" {
		t.Fatalf("%+v", r)
	}
	d.run("stop")
	if r := mustCheck(t, c, "api", "k", 1); r.Source != "client_fail_open" {
		t.Fatalf("%+v", r)
	}
	d.run("start")
	if r := mustCheck(t, c, "api", "k", 1); r.Source != "local" || r.Remaining != 4 {
		t.Fatalf("%+v", r)
	}
	d.run("stop")
	d.run("start")
	if r := mustCheck(t, c, "api", "k", 1); r.Source != "local" {
		t.Fatalf("%+v", r)
	}
}

func TestTimeoutWhenStalled(t *testing.T) {
	d := startDaemon(t)
	c := client(t, d.socket, 5*time.Second)
	if r := mustCheck(t, c, "fast", "k", 1); r.Source != "local" {
		t.Fatalf("%+v", r)
	}
	c.Timeout = 300 * time.Millisecond
	d.run("pause")
	t0 := time.Now()
	r := mustCheck(t, c, "fast", "k", 1)
	if r.Source != "client_fail_open" || r.Err == nil || !strings.Contains(r.Err.Error(), "timeout") || time.Since(t0) > 3*time.Second {
		t.Fatalf("%+v after %v", r, time.Since(t0))
	}
	cl := client(t, d.socket, 300*time.Millisecond)
	cl.FailOpen = false
	if r := mustCheck(t, cl, "fast", "k", 1); r.Source != "client_fail_closed" {
		t.Fatalf("%+v", r)
	}
	d.run("resume")
	c.Timeout = 5 * time.Second
	if r := mustCheck(t, c, "fast", "k", 1); r.Source != "local" {
		t.Fatalf("%+v", r)
	}
}
