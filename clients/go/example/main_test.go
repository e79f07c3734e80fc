package main

// The example application, built against the client through its module path (replace
// ../), gets 429 and the rate-limit headers from a real daemon once the rule's 5 are used.

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	ratelimitd "github.com/ratelimitd/ratelimitd/clients/go"
)

func TestExampleAppAnswers429WithHeaders(t *testing.T) {
	dir, err := os.MkdirTemp(os.Getenv("RL_TEST_ROOT"), "rl-go-example-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	daemon := func(cmd string) {
		if out, err := exec.Command("bash", "../../testdaemon.sh", cmd, dir).CombinedOutput(); err != nil {
			t.Fatalf("testdaemon.sh %s: %v\n%s", cmd, err, out)
		}
	}
	daemon("start")
	defer daemon("stop")

	rl := ratelimitd.New(filepath.Join(dir, "rl.sock"))
	defer rl.Close()
	srv := httptest.NewServer(handler(rl, "api"))
	defer srv.Close()
	for i := 1; i <= 6; i++ {
		res, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		t.Logf("request %d: %d RateLimit-Policy: %s RateLimit: %s Retry-After: %s", i, res.StatusCode,
			res.Header.Get("RateLimit-Policy"), res.Header.Get("RateLimit"), res.Header.Get("Retry-After"))
		if i <= 5 && res.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, res.StatusCode)
		}
		if i == 6 && (res.StatusCode != http.StatusTooManyRequests ||
			!regexp.MustCompile(`^"api";q=5(;w=5000)?$`).MatchString(res.Header.Get("RateLimit-Policy")) ||
			!regexp.MustCompile(`^"api";r=0;t=\d+$`).MatchString(res.Header.Get("RateLimit")) ||
			res.Header.Get("Retry-After") == "") {
			t.Fatalf("request 6: %d %v", res.StatusCode, res.Header)
		}
	}
}
