// Kept Unix-socket connections to the daemon: a small idle pool safe for goroutines, and
// one pipelined round trip on one connection under a deadline and a context.

package ratelimitd

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

type conn struct {
	nc net.Conn
	rd *bufio.Reader
}

type pool struct {
	mu   sync.Mutex
	idle []*conn
}

func (p *pool) take() *conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.idle); n > 0 {
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		return c
	}
	return nil
}

// put keeps c if fewer than max are idle, else closes it.
func (p *pool) put(c *conn, max int) {
	p.mu.Lock()
	if len(p.idle) < max {
		p.idle = append(p.idle, c)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	c.nc.Close()
}

// drain closes every idle connection.
func (p *pool) drain() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		c.nc.Close()
	}
}

func (p *pool) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

func dial(ctx context.Context, path string, deadline time.Time) (*conn, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	return &conn{nc: nc, rd: bufio.NewReader(nc)}, nil
}

// errClosed is the daemon closing the connection: on a kept one, worth one retry.
var errClosed = errors.New("daemon closed the connection")

// exchange writes payload and reads replies until n arrived, appending to *lines (kept
// on error). A done ctx interrupts it. inStep is false when more bytes came than replies
// were asked for (do not reuse the connection).
func (c *conn) exchange(ctx context.Context, payload []byte, n int, deadline time.Time, lines *[]string) (inStep bool, err error) {
	if err := c.nc.SetDeadline(deadline); err != nil {
		return false, err
	}
	if done := ctx.Done(); done != nil {
		stop, exited := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(exited)
			select {
			case <-done:
				c.nc.SetDeadline(time.Unix(1, 0)) // wakes the blocked read or write now
			case <-stop:
			}
		}()
		// Wait for the watcher: it must not touch the deadline once the connection is
		// back in the pool.
		defer func() { close(stop); <-exited }()
	}
	if _, err := c.nc.Write(payload); err != nil {
		return false, err
	}
	for len(*lines) < n {
		line, err := c.rd.ReadString('\n')
		if err != nil {
			if err == io.EOF {
				return false, errClosed
			}
			return false, err
		}
		*lines = append(*lines, strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r"))
	}
	return c.rd.Buffered() == 0, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		(errors.As(err, &ne) && ne.Timeout())
}
