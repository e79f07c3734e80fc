package ratelimitd

// Runs conformance.json's several_cases (CheckAll and Refund) against the client and its
// several_header_cases against the middleware WithAllOrNothing, each with the scripted
// stand-in daemon.

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"testing"
)

type severalCase struct {
	confCase
	Call string `json:"call"`
}

type severalResult struct {
	Allowed   bool    `json:"allowed"`
	Limit     uint64  `json:"limit"`
	Remaining uint64  `json:"remaining"`
	ResetMs   uint64  `json:"reset_ms"`
	WaitMs    uint64  `json:"wait_ms"`
	WindowMs  *uint64 `json:"window_ms"`
	Source    string  `json:"source"`
	Rule      string  `json:"rule"`
	Error     bool    `json:"error"`
}

// loadTable reads one table of ../conformance.json (never a copy of it).
func loadTable(t *testing.T, name string) []severalCase {
	data, err := os.ReadFile("../conformance.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	var cases []severalCase
	if err := json.Unmarshal(doc[name], &cases); err != nil || len(cases) == 0 {
		t.Fatalf("no %s in conformance.json (%v)", name, err)
	}
	return cases
}

func (c severalCase) generousClient(socket string) *Client {
	if _, ok := c.Options["timeout_ms"]; !ok {
		if c.Options == nil {
			c.Options = map[string]any{}
		}
		c.Options["timeout_ms"] = 5000.0 // a loaded machine must not turn a reply into a timeout
	}
	return c.client(socket)
}

func TestConformanceSeveral(t *testing.T) {
	for _, c := range loadTable(t, "several_cases") {
		c := c
		t.Run(c.Name, func(t *testing.T) {
			d := startStandIn(t, c.Daemon, c.Replies)
			cl := c.generousClient(d.socket)
			defer cl.Close()
			var want struct {
				Raises string        `json:"raises"`
				Result severalResult `json:"result"`
			}
			if err := json.Unmarshal(c.Expect, &want); err != nil {
				t.Fatal(err)
			}
			checks := c.checks()
			var r Result
			var err error
			if c.Call == "refund" {
				r, err = cl.Refund(context.Background(), checks[0].Rule, checks[0].Key, checks[0].Cost)
			} else {
				r, err = cl.CheckAll(context.Background(), checks)
			}
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
			got := severalResult{r.Allowed, r.Limit, r.Remaining, r.ResetMs, r.WaitMs, nil, r.Source, r.Rule, r.Err != nil && r.Err.Error() != ""}
			if r.HasWindow {
				got.WindowMs = &r.WindowMs
			}
			if !reflect.DeepEqual(got, want.Result) {
				t.Fatalf("got %+v (%v), want %+v", got, r.Err, want.Result)
			}
			if len(c.Requests) > 0 && !reflect.DeepEqual(d.seen(), c.Requests) {
				t.Errorf("requests %q, want %q", d.seen(), c.Requests)
			}
		})
	}
}

func TestConformanceSeveralHeaders(t *testing.T) {
	for _, c := range loadTable(t, "several_header_cases") {
		c := c
		t.Run(c.Name, func(t *testing.T) {
			d := startStandIn(t, c.Daemon, c.Replies)
			cl := c.generousClient(d.socket)
			defer cl.Close()
			if !serveCase(t, c.confCase, cl, []MiddlewareOption{WithAllOrNothing()}) {
				return
			}
			if len(c.Requests) > 0 && !reflect.DeepEqual(d.seen(), c.Requests) {
				t.Errorf("requests %q, want %q", d.seen(), c.Requests)
			}
		})
	}
}
