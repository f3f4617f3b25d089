package delayproxy

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echoServer answers every line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadBytes('\n')
					if err != nil {
						return
					}
					if _, err := c.Write(line); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// A round trip through the proxy takes at least the added time, bytes keep
// their order, and pipelined requests share one delay instead of paying one
// each.
func TestDelayKeepsOrderAndPipelining(t *testing.T) {
	const rtt = 20 * time.Millisecond
	p, err := New(echoServer(t), rtt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)

	got, err := MeasureRTT(5, func() error {
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return err
		}
		_, err := r.ReadString('\n')
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got < rtt {
		t.Fatalf("a round trip took %v through a proxy adding %v", got, rtt)
	}

	// Fifty pipelined requests: answers in order, in about one added round
	// trip rather than fifty. The bound is loose (ten round trips), so a
	// busy machine does not fail it; sending them one by one would take
	// fifty.
	start := time.Now()
	for i := range 50 {
		if _, err := c.Write([]byte{byte('A' + i%26), '\n'}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if want := string([]byte{byte('A' + i%26), '\n'}); line != want {
			t.Fatalf("answer %d is %q, want %q", i, line, want)
		}
	}
	if d := time.Since(start); d > 10*rtt {
		t.Fatalf("50 pipelined requests took %v through a proxy adding %v per round trip", d, rtt)
	}
}

func TestNewRejectsANonPositiveRTT(t *testing.T) {
	if _, err := New("127.0.0.1:1", 0); err == nil {
		t.Fatal("New accepted a zero round-trip time")
	}
}
