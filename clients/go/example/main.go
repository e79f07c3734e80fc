// An application consuming the client as its users do (its own module, importing the
// client's module path): a net/http server limited per client address.
//
//	go run . /run/ratelimitd/ratelimitd.sock 127.0.0.1:8080 rides_request
package main

import (
	"log"
	"net"
	"net/http"
	"os"

	ratelimitd "github.com/ratelimitd/ratelimitd/clients/go"
)

// handler is the application: hello, behind the rate-limit middleware.
func handler(rl *ratelimitd.Client, rule string) http.Handler {
	limit := ratelimitd.Middleware(rl, func(r *http.Request) []ratelimitd.Check {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		return []ratelimitd.Check{{Rule: rule, Key: "ip:" + host, Cost: 1}}
	})
	return limit(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("hello\n"))
	}))
}

func main() {
	if len(os.Args) != 4 {
		log.Fatal("usage: example SOCKET ADDR RULE")
	}
	rl := ratelimitd.New(os.Args[1])
	log.Fatal(http.ListenAndServe(os.Args[2], handler(rl, os.Args[3])))
}
