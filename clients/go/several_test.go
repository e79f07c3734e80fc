package ratelimitd

import (
	"bytes"
	"context"
	"log"
	"path/filepath"
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
