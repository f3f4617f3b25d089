// Package delayproxy is a TCP proxy on the loopback interface that adds a
// round-trip time to every connection through it: each direction is delayed
// by half of it. Bytes keep their order and a client's pipelined requests
// stay pipelined (the delay is a delay line, not a rate limit), so a
// server behind it behaves as one across a network would. The bench uses
// it; it is never part of the library.
//
// Go's timers wake a sleeping process no sooner than about a millisecond
// late on Linux, so the delays are slept with nanosleep(2) on the
// forwarding goroutine's thread, which keeps them within tens of
// microseconds. Measure what a proxy really adds (MeasureRTT) rather than
// trusting the setting.
package delayproxy

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Proxy forwards connections to one target, delaying both directions.
type Proxy struct {
	ln     net.Listener
	target string
	oneWay time.Duration
	wg     sync.WaitGroup
	mu     sync.Mutex
	open   map[net.Conn]struct{}
	closed bool
}

// New starts a proxy on a free loopback port that forwards to target (a
// host:port) with rtt added to every round trip. rtt must be positive.
func New(target string, rtt time.Duration) (*Proxy, error) {
	if rtt <= 0 {
		return nil, fmt.Errorf("delayproxy: the added round-trip time must be positive, not %v", rtt)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("delayproxy: %w", err)
	}
	p := &Proxy{ln: ln, target: target, oneWay: rtt / 2, open: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops accepting, ends every connection and waits for its
// goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.open {
		_ = c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.open[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.open, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.handle(client) })
	}
}

func (p *Proxy) handle(client net.Conn) {
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(server) {
		return
	}
	defer p.untrack(server)
	noDelay(client)
	noDelay(server)
	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(server, client) })
	wg.Go(func() { p.pipe(client, server) })
	wg.Wait()
}

func noDelay(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
}

// chunk is what one read returned, and when it may be written on.
type chunk struct {
	data []byte
	due  time.Time
}

// pipe copies src to dst through a delay line: a reader stamps each chunk
// with its arrival, a writer sends it on one way's delay later. When either
// side ends, both connections are closed.
func (p *Proxy) pipe(dst, src net.Conn) {
	line := make(chan chunk, 4096)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(line)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				line <- chunk{data: buf[:n], due: time.Now().Add(p.oneWay)}
			}
			if err != nil {
				return
			}
		}
	})
	for c := range line {
		sleepUntil(c.due)
		if _, err := dst.Write(c.data); err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
	for range line { // let the reader finish
	}
	wg.Wait()
}

// sleepUntil sleeps until t with nanosleep(2), which blocks this
// goroutine's thread with far finer resolution than a Go timer.
func sleepUntil(t time.Time) {
	for {
		d := time.Until(t)
		if d <= 0 {
			return
		}
		ts := syscall.NsecToTimespec(int64(d))
		if err := syscall.Nanosleep(&ts, nil); err != nil && !errors.Is(err, syscall.EINTR) {
			return
		}
	}
}

// MeasureRTT times n sequential round trips of ping (a request and its
// whole answer) and returns their median.
func MeasureRTT(n int, ping func() error) (time.Duration, error) {
	if n < 1 {
		return 0, errors.New("delayproxy: MeasureRTT needs at least one round trip")
	}
	times := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if err := ping(); err != nil {
			return 0, err
		}
		times = append(times, time.Since(start))
	}
	return median(times), nil
}

func median(xs []time.Duration) time.Duration {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
