package limit

import (
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// rejectBody is the JSON body of rejectResponse.
const rejectBody = `{"error":{"code":"resource_exhausted","message":"connection: too many connections; retry later"}}`

// rejectResponse is written to a connection refused for being over a
// connection limit (plain HTTP only), so clients see why. Its
// Content-Length is the body's, counted by the compiler.
var rejectResponse = []byte("HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\nContent-Type: application/json\r\n" +
	"Content-Length: " + strconv.Itoa(len(rejectBody)) + "\r\n\r\n" + rejectBody)

// Listener wraps a listener so that at most max connections are open
// at once and at most perClient from one address, and each address
// opens new connections at most at rates. A connection over a limit is
// answered 503 (best effort, 50 ms) and closed at once instead of being
// queued, so a flood of sockets holds no file descriptor for long and
// cannot starve the store of them.
type Listener struct {
	net.Listener
	max, perClient int
	rates          *Rates
	plain          bool // not TLS: a 503 can be written raw

	mu       sync.Mutex
	open     int
	byClient map[netip.Addr]int
	rejected atomic.Int64
}

// NewListener wraps ln: at most max connections at once (0: no limit),
// perClient from one address, new ones from an address at rates (nil:
// no limit); plain is true when ln is not TLS, so a refusal can be
// written raw.
func NewListener(ln net.Listener, max, perClient int, rates *Rates, plain bool) *Listener {
	return &Listener{Listener: ln, max: max, perClient: perClient, rates: rates, plain: plain,
		byClient: map[netip.Addr]int{}}
}

// Accept returns the next connection within the limits.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := peerIP(c.RemoteAddr())
		if l.admit(ip) {
			capSendBuffer(c)
			return &limitedConn{Conn: c, release: func() { l.release(ip) }}, nil
		}
		l.rejected.Add(1)
		if l.plain {
			_ = c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
			_, _ = c.Write(rejectResponse)
		}
		_ = c.Close()
	}
}

func (l *Listener) admit(ip netip.Addr) bool {
	if l.rates != nil {
		if ok, _ := l.rates.Take("c:"+ip.String(), time.Now()); !ok {
			return false
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if (l.max > 0 && l.open >= l.max) || (l.perClient > 0 && l.byClient[ip] >= l.perClient) {
		return false
	}
	l.open++
	l.byClient[ip]++
	return true
}

func (l *Listener) release(ip netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if n := l.byClient[ip] - 1; n > 0 {
		l.byClient[ip] = n
	} else {
		delete(l.byClient, ip)
	}
}

// sendBuffer caps the kernel's send buffer of each HTTP connection
// (Linux doubles the figure for its own bookkeeping). Left to
// autotuning, loopback and LAN connections grow it to several MiB, so a
// whole 10,000-reading page (about 1 MiB of JSON) vanishes into the
// kernel for a client that never reads it: the stall timeout never
// fires, and that memory (charged to the container's cgroup) stays
// held until the idle timeout, up to 4 MiB per connection. With the
// cap, such a client stalls the response's writer and is cut off
// after the stall timeout, and at most 512 KiB of kernel memory waits
// on it. The cost: one connection moves at most 256 KiB per round
// trip (25 MiB/s at 10 ms, 2.5 MiB/s at 100 ms), ample for pages of at
// most 10,000 readings.
const sendBuffer = 256 << 10

// capSendBuffer applies sendBuffer to a TCP connection; other kinds of
// connection (tests' pipes, unix sockets) keep theirs.
func capSendBuffer(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(sendBuffer) // best effort: the stall timeout still bounds what the process holds
	}
}

// Rejected is how many connections were refused.
func (l *Listener) Rejected() int64 { return l.rejected.Load() }

func peerIP(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok {
			return ip.Unmap()
		}
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// limitedConn gives its slot back once, on Close.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
