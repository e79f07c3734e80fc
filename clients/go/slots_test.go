package ratelimitd

// Concurrency slots against a real daemon (rule "inflight": 2 slots per key).

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestDaemonSlotsAcquireDenyReleaseAndWithSlot(t *testing.T) {
	d := startDaemon(t)
	c := client(t, d.socket, 5*time.Second)
	ctx := context.Background()
	a, _ := c.Acquire(ctx, "inflight", "k1")
	b, _ := c.Acquire(ctx, "inflight", "k1")
	if !a.Allowed || !b.Allowed || a.Token == "" || a.Limit != 2 || b.Remaining != 0 || a.Source != "local" {
		t.Fatalf("%+v %+v", a, b)
	}
	denied, _ := c.Acquire(ctx, "inflight", "k1")
	if denied.Allowed || denied.WaitMs < 55000 {
		t.Fatalf("%+v", denied)
	}
	if got := denied.Headers()["RateLimit-Policy"]; got != `"inflight";q=2;qu="concurrent-requests"` {
		t.Fatal(got)
	}
	if !a.Release(ctx) || a.Release(ctx) {
		t.Fatal("release once")
	}
	if s, _ := c.Acquire(ctx, "inflight", "k1"); !s.Allowed {
		t.Fatal("a released slot is free")
	}
	var re *RequestError
	if _, err := c.Acquire(ctx, "api", "k"); !errors.As(err, &re) || re.Code != "RULE" {
		t.Fatal(err)
	}
	boom := errors.New("handler failed")
	for i := 0; i < 3; i++ {
		if err := c.WithSlot(ctx, "inflight", "k2", func(s *Slot) error { return boom }); err != boom {
			t.Fatal(err)
		}
	}
	func() {
		defer func() { recover() }()
		c.WithSlot(ctx, "inflight", "k2", func(s *Slot) error { panic("handler panicked") })
	}()
	x, _ := c.Acquire(ctx, "inflight", "k2")
	y, _ := c.Acquire(ctx, "inflight", "k2")
	if !x.Allowed || !y.Allowed {
		t.Fatal("WithSlot did not give its slots back")
	}
}

func TestDaemonSlotsMiddlewareReleasesAfterHandlerAndPanic(t *testing.T) {
	d := startDaemon(t)
	c := client(t, d.socket, 5*time.Second)
	h := ConcurrencyMiddleware(c, "inflight", func(*http.Request) string { return "web" })(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/boom" {
				panic(http.ErrAbortHandler)
			}
			w.Write([]byte("hello"))
		}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	for i := 0; i < 5; i++ {
		res, err := http.Get(srv.URL + "/")
		if err != nil || res.StatusCode != 200 || res.Header.Get("RateLimit-Policy") != `"inflight";q=2;qu="concurrent-requests"` {
			t.Fatalf("%v %+v", err, res)
		}
		res.Body.Close()
		if res, err := http.Get(srv.URL + "/boom"); err == nil {
			res.Body.Close()
		}
	}
	ctx := context.Background()
	a, _ := c.Acquire(ctx, "inflight", "web")
	b, _ := c.Acquire(ctx, "inflight", "web")
	if !a.Allowed || !b.Allowed {
		t.Fatal("the middleware did not give its slots back")
	}
	res, err := http.Get(srv.URL + "/")
	if err != nil || res.StatusCode != 429 || res.Header.Get("Retry-After") == "" {
		t.Fatalf("%v %+v", err, res)
	}
	res.Body.Close()
}
