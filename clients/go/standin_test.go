package ratelimitd

// A scripted stand-in for the daemon on a Unix socket, driven by one case of
// clients/conformance.json: replies from a list, stalls, closes, or no socket at all.

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

type standIn struct {
	socket      string
	connections atomic.Int32
	mu          sync.Mutex
	requests    []string
}

func tempDir(t *testing.T) string {
	dir, err := os.MkdirTemp(os.Getenv("RL_TEST_ROOT"), "rl-go-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func startStandIn(t *testing.T, mode string, replies []string) *standIn {
	s := &standIn{socket: filepath.Join(tempDir(t), "s.sock")}
	if mode == "absent" {
		return s
	}
	ln, err := net.Listen("unix", s.socket)
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.Map
	t.Cleanup(func() {
		ln.Close()
		conns.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.connections.Add(1)
			conns.Store(c, true)
			go s.serve(c, mode, replies)
		}
	}()
	return s
}

func (s *standIn) serve(c net.Conn, mode string, replies []string) {
	defer c.Close()
	if mode == "close" {
		buf := make([]byte, 4096)
		c.Read(buf)
		return
	}
	rd := bufio.NewReader(c)
	served := 0
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			return
		}
		s.mu.Lock()
		s.requests = append(s.requests, strings.TrimSuffix(line, "\n"))
		s.mu.Unlock()
		if mode == "stall" || served >= len(replies) {
			continue
		}
		reply := replies[served]
		served++
		if _, err := c.Write([]byte(reply + "\n")); err != nil {
			return
		}
		if strings.HasPrefix(reply, "ERR BUSY") || strings.HasPrefix(reply, "ERR PERM") {
			return
		}
	}
}

func (s *standIn) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.requests...)
}
