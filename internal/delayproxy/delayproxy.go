// Package delayproxy is a TCP proxy on the loopback interface that adds a
// round-trip time to every connection through it: each direction is delayed
// by half of it. Bytes keep their order and a client's pipelined requests
// stay pipelined (the delay is a delay line, not a rate limit), so a
// server behind it behaves as one across a network would. The bench uses
// it; it is never part of the library.
//
// Go's timers wake a sleeping process no sooner than about a millisecond
// late on Linux, so one goroutine per proxy, on a thread of its own, sleeps
// with a raw nanosleep(2), which keeps the delays within tens of
// microseconds, and
// writes out every chunk that has come due. Every chunk is delayed by the
// same time, so the chunks come due in the order they arrived: one queue
// holds them all, and one wake-up releases all that are due, which keeps
// the proxy's own CPU low (the bench reports it). A write that blocks (a
// peer that stops reading) holds up the whole proxy: it is a benchmarking
// tool for small requests, not a general proxy. Measure what a proxy really
// adds (MeasureRTT) rather than trusting the setting.
package delayproxy

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"
	"unsafe"
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

	// The delay line: chunks in arrival order, written out by run.
	qmu   sync.Mutex
	queue []chunk
	wake  chan struct{} // a chunk was queued to an empty line
	done  chan struct{} // Close was called
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
	p := &Proxy{ln: ln, target: target, oneWay: rtt / 2, open: map[net.Conn]struct{}{},
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	p.wg.Go(p.serve)
	p.wg.Go(p.run)
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops accepting, ends every connection and waits for its
// goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if !p.closed {
		close(p.done)
	}
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

// chunk is what one read returned, where it goes, and when it may go.
type chunk struct {
	dst  net.Conn
	data []byte
	due  time.Time
}

// pipe reads src into the delay line, bound for dst. When src ends, both
// connections are closed once what was read before has been written.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.push(chunk{dst: dst, data: bytes.Clone(buf[:n]), due: time.Now().Add(p.oneWay)})
		}
		if err != nil {
			p.push(chunk{dst: dst, due: time.Now().Add(p.oneWay)}) // nil data: close
			_ = src.Close()
			return
		}
	}
}

func (p *Proxy) push(c chunk) {
	p.qmu.Lock()
	p.queue = append(p.queue, c)
	first := len(p.queue) == 1
	p.qmu.Unlock()
	if first {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// run writes the chunks out as they come due, on a thread of its own.
func (p *Proxy) run() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var due []chunk
	for {
		p.qmu.Lock()
		if len(p.queue) == 0 {
			p.qmu.Unlock()
			select {
			case <-p.wake:
				continue
			case <-p.done:
				return
			}
		}
		head := p.queue[0].due
		p.qmu.Unlock()
		sleepUntil(head)
		// Release everything due by now, in order.
		now := time.Now()
		p.qmu.Lock()
		i := 0
		for i < len(p.queue) && !p.queue[i].due.After(now) {
			i++
		}
		due = append(due[:0], p.queue[:i]...)
		p.queue = append(p.queue[:0], p.queue[i:]...)
		p.qmu.Unlock()
		for _, c := range due {
			if c.data == nil {
				_ = c.dst.Close()
				continue
			}
			if _, err := c.dst.Write(c.data); err != nil {
				_ = c.dst.Close()
			}
		}
		clear(due)
	}
}

// sleepUntil sleeps until t with nanosleep(2), which has far finer
// resolution than a Go timer. It is a raw system call: the runtime does not
// hand this thread's P to another thread while it sleeps (a sleep is shorter
// than the scheduler's time slice), which would cost two thread switches per
// wake-up; New's callers should leave a P free for the other goroutines
// (GOMAXPROCS of 2 or more). A preemption signal interrupts the sleep
// (EINTR) and it resumes.
func sleepUntil(t time.Time) {
	for {
		d := time.Until(t)
		if d <= 0 {
			return
		}
		ts := syscall.NsecToTimespec(int64(d))
		_, _, errno := syscall.RawSyscall(syscall.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
		if errno != 0 && errno != syscall.EINTR {
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
