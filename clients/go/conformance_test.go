package ratelimitd

// Runs every case of clients/conformance.json (the table all clients share) against the
// client and against the middleware, each with a scripted stand-in daemon.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

type confCase struct {
	Name     string          `json:"name"`
	Checks   [][]any         `json:"checks"`
	Options  map[string]any  `json:"options"`
	Daemon   string          `json:"daemon"`
	Replies  []string        `json:"replies"`
	Requests []string        `json:"requests"`
	Expect   json.RawMessage `json:"expect"`
}

type confExpect struct {
	Raises  string `json:"raises"`
	Results []struct {
		Allowed   bool    `json:"allowed"`
		Limit     uint64  `json:"limit"`
		Remaining uint64  `json:"remaining"`
		ResetMs   uint64  `json:"reset_ms"`
		WaitMs    uint64  `json:"wait_ms"`
		WindowMs  *uint64 `json:"window_ms"`
		Source    string  `json:"source"`
		Error     bool    `json:"error"`
	} `json:"results"`
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
}

func loadCases(t *testing.T) []confCase {
	data, err := os.ReadFile("../conformance.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Cases []confCase `json:"cases"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Cases) == 0 {
		t.Fatal("no cases in conformance.json")
	}
	return doc.Cases
}

func (c confCase) checks() []Check {
	var out []Check
	for _, ch := range c.Checks {
		out = append(out, Check{Rule: ch[0].(string), Key: ch[1].(string), Cost: uint32(ch[2].(float64))})
	}
	return out
}

func (c confCase) option(name string, def any) any {
	if v, ok := c.Options[name]; ok {
		return v
	}
	return def
}

func (c confCase) client(socket string) *Client {
	cl := New(socket)
	cl.FailOpen = c.option("fail_open", true).(bool)
	cl.Timeout = time.Duration(c.option("timeout_ms", 200.0).(float64)) * time.Millisecond
	return cl
}

func (c confCase) expect(t *testing.T) confExpect {
	var e confExpect
	if err := json.Unmarshal(c.Expect, &e); err != nil {
		t.Fatal(err)
	}
	return e
}

func TestConformanceClient(t *testing.T) {
	for _, c := range loadCases(t) {
		c := c
		t.Run(c.Name, func(t *testing.T) {
			d := startStandIn(t, c.Daemon, c.Replies)
			cl := c.client(d.socket)
			defer cl.Close()
			want := c.expect(t)
			checks := c.checks()
			t0 := time.Now()
			var rs []Result
			var err error
			if len(checks) == 1 {
				var r Result
				r, err = cl.Check(context.Background(), checks[0].Rule, checks[0].Key, checks[0].Cost)
				rs = []Result{r}
			} else {
				rs, err = cl.CheckMany(context.Background(), checks)
			}
			took := time.Since(t0)
			if want.Raises != "" {
				var re *RequestError
				if !errors.As(err, &re) || re.Code != want.Raises {
					t.Fatalf("want RequestError %s, got %v", want.Raises, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(rs) != len(want.Results) {
				t.Fatalf("%d results, want %d", len(rs), len(want.Results))
			}
			for i, w := range want.Results {
				r := rs[i]
				ok := r.Allowed == w.Allowed && r.Limit == w.Limit && r.Remaining == w.Remaining &&
					r.ResetMs == w.ResetMs && r.WaitMs == w.WaitMs && r.Source == w.Source &&
					(r.Err != nil && r.Err.Error() != "") == w.Error && r.Rule == checks[i].Rule &&
					r.HasWindow == (w.WindowMs != nil) && (w.WindowMs == nil || *w.WindowMs == r.WindowMs)
				if !ok {
					t.Errorf("result %d: got %+v, want %+v", i, r, w)
				}
			}
			if len(c.Requests) > 0 && !reflect.DeepEqual(d.seen(), c.Requests) {
				t.Errorf("requests %q, want %q", d.seen(), c.Requests)
			}
			if c.Daemon == "stall" || c.Daemon == "close" {
				time.Sleep(50 * time.Millisecond)
				if n := d.connections.Load(); n != 1 {
					t.Errorf("%d connections: a timeout or a fresh connection is never retried", n)
				}
			}
			if c.Daemon == "stall" && (took < cl.Timeout-5*time.Millisecond || took > cl.Timeout+time.Second) {
				t.Errorf("took %v with a %v timeout", took, cl.Timeout)
			}
		})
	}
}

func TestConformanceMiddleware(t *testing.T) {
	for _, c := range loadCases(t) {
		c := c
		t.Run(c.Name, func(t *testing.T) {
			d := startStandIn(t, c.Daemon, c.Replies)
			cl := c.client(d.socket)
			defer cl.Close()
			serveCase(t, c, cl, nil)
		})
	}
}

// serveCase runs case c's checks through the middleware (with opts) on cl and checks
// the status and the rate-limit headers against c's expectation; false when the case
// expects a caller bug (a 500 without the handler).
func serveCase(t *testing.T, c confCase, cl *Client, opts []MiddlewareOption) bool {
	want := c.expect(t)
	if c.option("legacy_headers", false).(bool) {
		opts = append(opts, WithLegacyHeaders())
	}
	ran := false
	h := Middleware(cl, func(*http.Request) []Check { return c.checks() }, opts...)(
		http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { ran = true; w.Write([]byte("ok")) }))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if want.Raises != "" {
		if rec.Code != http.StatusInternalServerError || ran {
			t.Fatalf("a caller bug: want 500 without the handler, got %d (ran %v)", rec.Code, ran)
		}
		return false
	}
	if rec.Code != want.Status || ran != (want.Status == 200) {
		t.Fatalf("status %d (handler ran: %v), want %d", rec.Code, ran, want.Status)
	}
	got := map[string]string{}
	for k, v := range rec.Header() {
		lk := strings.ToLower(k)
		if lk == "ratelimit" || lk == "ratelimit-policy" || lk == "retry-after" || strings.HasPrefix(lk, "x-ratelimit-") {
			got[http.CanonicalHeaderKey(k)] = strings.Join(v, ", ")
		}
	}
	wantH := map[string]string{}
	for k, v := range want.Headers {
		wantH[http.CanonicalHeaderKey(k)] = v
	}
	if !reflect.DeepEqual(got, wantH) {
		t.Fatalf("headers %v, want %v", got, wantH)
	}
	return true
}
