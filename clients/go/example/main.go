// A tiny HTTP server rate-limited per client address through ratelimitd.
//
//	go run ./example /run/ratelimitd/ratelimitd.sock 127.0.0.1:8080 rides_request
package main

import (
	"log"
	"net"
	"net/http"
	"os"

	"ratelimitd"
)

func main() {
	socket, addr, rule := os.Args[1], os.Args[2], os.Args[3]
	rl := ratelimitd.New(socket)
	http.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		host, _, _ := net.SplitHostPort(req.RemoteAddr)
		r, err := rl.Check(rule, host, 1)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		r.WriteHeaders(w.Header())
		if !r.Allowed {
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		w.Write([]byte("hello\n"))
	})
	log.Fatal(http.ListenAndServe(addr, nil))
}
