// sotw-client: the SotW load client of bench/fanout.py (`--clients go`), the same
// check and the same line protocol as its Python `lean` client, compiled, so that on
// a machine where the client shares the cores with the server it measures, the
// client takes less of them (issue 27: the 2-worker fan-out on 2 cores).
//
// It opens -streams ADS SotW streams on the EDS resource -target, spread over
// -channels HTTP/2 connections to -server (raw frames, golang.org/x/net/http2's
// Framer), and checks every response as bench/sotw_check.py does: the first response
// of each change n is decoded in full (google.golang.org/protobuf, go-control-plane's
// Envoy types) and must be the target's CLA with -endpoints + n%2 endpoints; every
// other response of change n must be the same bytes but for its nonce (a
// DiscoveryResponse's field 5); one that differs is decoded and checked in full again. Each response
// is ACKed (type, names, version, and its nonce copied as it came: field 5 in both
// messages), as Envoy does.
//
// Lines to the parent on stdout (JSON), as bench/fanout.py's Arrivals writes them:
//
//	{"ready": N}                       N streams have their first message; then it
//	                                   waits for a line on stdin before opening more
//	{"run": n, "first": T, "last": T,  every stream has message n (n >= 1): the first
//	 "cpu": S, "wrong": W}             and last arrival (CLOCK_MONOTONIC seconds), the
//	                                   process's CPU seconds so far, and how many
//	                                   messages of change n did not say it
//
// It exits when stdin closes. -corrupt-run N hands one stream change N-1's message
// in place of change N's (the proof that a wrong message fails the run).
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

const (
	adsPath = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
	edsType = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
	// Field 5, length-delimited: a response's nonce, and an ACK's response_nonce too.
	nonceTag = 5<<3 | 2
	// Our receive windows: as large as HTTP/2 allows, so the server is never held
	// back; the connection's is topped up after each GiB read.
	maxWindow = 1<<31 - 1
	refill    = 1 << 30
)

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "sotw-client: "+format+"\n", args...)
	os.Exit(1)
}

// ------------------------------------------------------------------ clocks

// The parent reads the arrival times on its own CLOCK_MONOTONIC (Python's
// time.monotonic); Go's monotonic readings are that clock, offset.
var monoBase, startedAt = func() (float64, time.Time) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		fail("clock_gettime: %v", err)
	}
	return float64(ts.Sec) + float64(ts.Nsec)/1e9, time.Now()
}()

func monotonic() float64 { return monoBase + time.Since(startedAt).Seconds() }

func cpuSeconds() float64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		fail("clock_gettime: %v", err)
	}
	return float64(ts.Sec) + float64(ts.Nsec)/1e9
}

// ------------------------------------------------------------------ arrivals

// arrivals counts what every stream has: a stream's first message (its snapshot)
// counts it as open; message n >= 1 of every stream belongs to change n, reported
// once every stream has it.
type arrivals struct {
	mu       sync.Mutex
	streams  int
	goal     int
	opened   int
	ready    chan struct{}
	received map[int]int
	firstAt  map[int]float64
	wrong    map[int]int
	out      *bufio.Writer
}

func (a *arrivals) expect(goal int) chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.goal, a.ready = goal, make(chan struct{})
	if a.opened >= goal {
		close(a.ready)
	}
	return a.ready
}

func (a *arrivals) got(n int, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !ok {
		a.wrong[n]++
	}
	if n == 0 {
		a.opened++
		if a.opened == a.goal {
			close(a.ready)
		}
		return
	}
	count := a.received[n] + 1
	a.received[n] = count
	if count == 1 {
		a.firstAt[n] = monotonic()
	}
	if count == a.streams {
		last := monotonic()
		a.line(`{"run": %d, "first": %.9f, "last": %.9f, "cpu": %.9f, "wrong": %d}`,
			n, a.firstAt[n], last, cpuSeconds(), a.wrong[n])
	}
}

// line writes one line to the parent (callers hold mu, or run before any stream).
func (a *arrivals) line(format string, args ...any) {
	fmt.Fprintf(a.out, format+"\n", args...)
	if err := a.out.Flush(); err != nil {
		fail("stdout: %v", err)
	}
}

// ------------------------------------------------------------------ the check

type knownChange struct {
	prefix  []byte // every right response of the change, up to its nonce
	suffix  []byte // and after it (meshbridge writes control_plane, field 6, last)
	ackHead []byte // the ACK, up to its nonce
}

// checker is bench/sotw_check.py's SotwReader: one per process, shared by every
// connection, so that each change is decoded in full once (more only when two
// connections read its first response at the same moment).
type checker struct {
	mu        sync.RWMutex
	known     map[int]*knownChange
	decoded   atomic.Int64 // responses decoded in full (the rest compared by bytes)
	target    string
	endpoints int
}

// read appends to dst the ACK for raw, the response to change n, and says whether
// raw says change n.
func (c *checker) read(n int, raw, dst []byte) (bool, []byte) {
	c.mu.RLock()
	k := c.known[n]
	c.mu.RUnlock()
	if k != nil {
		at := len(k.prefix)
		if len(raw) > at+1 && raw[at] == nonceTag && raw[at+1] < 0x80 {
			end := at + 2 + int(raw[at+1])
			if end+len(k.suffix) == len(raw) && bytes.Equal(raw[:at], k.prefix) &&
				bytes.Equal(raw[end:], k.suffix) {
				return true, append(append(dst, k.ackHead...), raw[at:end]...)
			}
		}
	}
	return c.readInFull(n, raw, dst)
}

func (c *checker) readInFull(n int, raw, dst []byte) (bool, []byte) {
	c.decoded.Add(1)
	var message discovery.DiscoveryResponse
	if err := proto.Unmarshal(raw, &message); err != nil {
		return false, dst
	}
	ackHead, err := proto.MarshalOptions{Deterministic: true}.Marshal(&discovery.DiscoveryRequest{
		VersionInfo: message.VersionInfo, ResourceNames: []string{c.target}, TypeUrl: edsType})
	if err != nil {
		fail("encoding an ACK: %v", err)
	}
	nonce := protowire.AppendString(protowire.AppendTag(nil, 5, protowire.BytesType),
		message.Nonce)
	ok := message.TypeUrl == edsType && c.says(n, &message)
	if at, end := nonceField(raw); ok && at >= 0 && len(message.Nonce) < 0x80 {
		c.mu.Lock()
		if c.known[n] == nil {
			c.known[n] = &knownChange{prefix: append([]byte(nil), raw[:at]...),
				suffix: append([]byte(nil), raw[end:]...), ackHead: ackHead}
		}
		c.mu.Unlock()
	}
	return ok, append(append(dst, ackHead...), nonce...)
}

// nonceField: where the one top-level field 5 of a (decodable) response starts and
// ends; -1, -1 if it has none or more than one.
func nonceField(raw []byte) (int, int) {
	at, end := -1, -1
	for offset := 0; offset < len(raw); {
		number, kind, n := protowire.ConsumeTag(raw[offset:])
		if n < 0 {
			return -1, -1
		}
		m := protowire.ConsumeFieldValue(number, kind, raw[offset+n:])
		if m < 0 {
			return -1, -1
		}
		if number == 5 {
			if at >= 0 {
				return -1, -1
			}
			at, end = offset, offset+n+m
		}
		offset += n + m
	}
	return at, end
}

// says: the one resource is the target's CLA with the endpoints change n gives (run
// n scales the service up, odd n, or back down, even n, by one pod).
func (c *checker) says(n int, message *discovery.DiscoveryResponse) bool {
	if len(message.Resources) != 1 || message.Resources[0].TypeUrl != edsType {
		return false
	}
	var cla endpoint.ClusterLoadAssignment
	if err := proto.Unmarshal(message.Resources[0].Value, &cla); err != nil {
		return false
	}
	count := 0
	for _, locality := range cla.Endpoints {
		count += len(locality.LbEndpoints)
	}
	return cla.ClusterName == c.target && count == c.endpoints+n%2
}

func nodeNamed(id string) *core.Node { return &core.Node{Id: id} }

// ------------------------------------------------------------------ a connection

type connection struct {
	index    int
	fr       *http2.Framer
	conn     net.Conn
	in       *bufio.Reader
	wmu      sync.Mutex // the Framer's writes, bw and the windows below
	bw       *bufio.Writer
	henc     *hpack.Encoder
	hbuf     bytes.Buffer
	ready    chan struct{}
	settled  bool
	nextID   uint32
	window   int64   // the server's connection window for what we send
	initial  int64   // the server's initial stream window
	windows  []int64 // per stream (id>>1): what we may still send; -1 once it ended
	held     []heldMessage
	seen     []int // per stream (id>>1): messages so far (read side only)
	partial  map[uint32][]byte
	received int
	ack      []byte
	frame    []byte
	check    *checker
	arrivals *arrivals
	corrupt  int
	previous map[int][]byte
	closing  bool
}

type heldMessage struct {
	sid     uint32
	message []byte
}

func dial(index int, server string, check *checker, arr *arrivals, corrupt int) *connection {
	conn, err := net.Dial("tcp", server)
	if err != nil {
		fail("connecting to %s: %v", server, err)
	}
	c := &connection{index: index, conn: conn, in: bufio.NewReaderSize(conn, 256<<10),
		bw: bufio.NewWriterSize(conn, 64<<10), ready: make(chan struct{}), nextID: 1,
		window: 65535, initial: 65535, partial: map[uint32][]byte{}, check: check,
		arrivals: arr, corrupt: corrupt, previous: map[int][]byte{}}
	c.fr = http2.NewFramer(c.bw, c.in)
	c.fr.SetMaxReadFrameSize(1<<24 - 1)
	c.fr.SetReuseFrames()
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.wmu.Lock()
	c.bw.WriteString(http2.ClientPreface)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: maxWindow},
		http2.Setting{ID: http2.SettingEnablePush, Val: 0})
	c.fr.WriteWindowUpdate(0, maxWindow-65535)
	c.flushLocked()
	c.wmu.Unlock()
	go c.readLoop()
	return c
}

func (c *connection) flushLocked() {
	if err := c.bw.Flush(); err != nil && !c.closing {
		fail("connection %d: %v", c.index, err)
	}
}

// open starts a stream with its first request (the caller flushes).
func (c *connection) open(request []byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	sid := c.nextID
	c.nextID += 2
	c.hbuf.Reset()
	for _, field := range [][2]string{{":method", "POST"}, {":scheme", "http"},
		{":path", adsPath}, {":authority", c.conn.RemoteAddr().String()},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		c.henc.WriteField(hpack.HeaderField{Name: field[0], Value: field[1]})
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid,
		BlockFragment: c.hbuf.Bytes(), EndHeaders: true}); err != nil {
		fail("connection %d: %v", c.index, err)
	}
	c.windows = append(c.windows, c.initial)
	c.sendLocked(sid, request)
}

func (c *connection) flush() {
	c.wmu.Lock()
	c.flushLocked()
	c.wmu.Unlock()
}

// sendLocked writes one gRPC message on stream sid, or holds it until the server's
// windows allow it.
func (c *connection) sendLocked(sid uint32, message []byte) {
	i := sid >> 1
	size := int64(len(message) + 5)
	if c.windows[i] < 0 {
		return // the stream is over
	}
	if len(c.held) > 0 || size > c.windows[i] || size > c.window {
		c.held = append(c.held, heldMessage{sid, append([]byte(nil), message...)})
		return
	}
	c.windows[i] -= size
	c.window -= size
	// The frame header and the gRPC prefix (RFC 9113, section 4.1; gRPC over HTTP/2).
	f := append(c.frame[:0], byte(size>>16), byte(size>>8), byte(size), byte(http2.FrameData),
		0, byte(sid>>24), byte(sid>>16), byte(sid>>8), byte(sid), 0)
	f = binary.BigEndian.AppendUint32(f, uint32(len(message)))
	c.frame = append(f, message...)
	c.bw.Write(c.frame)
}

func (c *connection) readLoop() {
	for {
		frame, err := c.fr.ReadFrame()
		if err != nil {
			if _, ok := err.(http2.StreamError); ok {
				fmt.Fprintf(os.Stderr, "sotw-client: connection %d: %v\n", c.index, err)
				continue
			}
			c.wmu.Lock()
			closing := c.closing
			c.wmu.Unlock()
			if closing {
				return
			}
			fail("connection %d: %v", c.index, err)
		}
		switch f := frame.(type) {
		case *http2.DataFrame:
			c.onData(f)
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				if status := f.PseudoValue("status"); status != "" && status != "200" {
					fmt.Fprintf(os.Stderr, "sotw-client: stream %d: HTTP %s\n", f.StreamID, status)
				}
				for _, field := range f.RegularFields() {
					if field.Name == "grpc-status" && field.Value != "0" {
						fmt.Fprintf(os.Stderr, "sotw-client: stream %d ended: grpc-status %s\n",
							f.StreamID, field.Value)
					}
				}
				c.ended(f.StreamID)
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.onSettings(f)
			}
		case *http2.WindowUpdateFrame:
			c.onWindowUpdate(f.StreamID, int64(f.Increment))
		case *http2.PingFrame:
			if !f.IsAck() {
				c.wmu.Lock()
				c.fr.WritePing(true, f.Data)
				c.wmu.Unlock()
			}
		case *http2.RSTStreamFrame:
			c.ended(f.StreamID)
		}
		if c.in.Buffered() == 0 {
			// Everything read so far is answered: one write for all its ACKs.
			c.flush()
		}
	}
}

func (c *connection) onData(f *http2.DataFrame) {
	c.received += int(f.Header().Length)
	data, sid := f.Data(), f.StreamID
	if part, ok := c.partial[sid]; ok || len(data) < 5 ||
		int(binary.BigEndian.Uint32(data[1:5]))+5 != len(data) {
		// A message in pieces (rare here: the server writes one whole message a frame).
		part = append(part, data...)
		for len(part) >= 5 {
			n := int(binary.BigEndian.Uint32(part[1:5]))
			if len(part) < n+5 {
				break
			}
			c.onMessage(sid, part[5:n+5])
			part = part[n+5:]
		}
		if len(part) > 0 {
			c.partial[sid] = part // our own copy (append above), not the Framer's buffer
		} else {
			delete(c.partial, sid)
		}
	} else {
		c.onMessage(sid, data[5:])
	}
	if f.StreamEnded() {
		c.ended(sid)
	}
	if c.received >= refill {
		c.wmu.Lock()
		c.fr.WriteWindowUpdate(0, uint32(c.received))
		c.wmu.Unlock()
		c.received = 0
	}
}

func (c *connection) onMessage(sid uint32, raw []byte) {
	i := int(sid >> 1)
	for len(c.seen) <= i {
		c.seen = append(c.seen, 0)
	}
	n := c.seen[i]
	c.seen[i]++
	if c.corrupt > 0 && c.index == 0 && sid == 1 {
		// Proof that a wrong message fails the run: this stream is handed the change
		// before's message in place of change -corrupt-run's.
		if n == c.corrupt {
			if before, ok := c.previous[n-1]; ok {
				raw = before
			}
		}
		c.previous[n] = append([]byte(nil), raw...)
	}
	ok, ack := c.check.read(n, raw, c.ack[:0])
	c.ack = ack
	c.arrivals.got(n, ok)
	if len(ack) > 0 {
		c.wmu.Lock()
		c.sendLocked(sid, ack)
		c.wmu.Unlock()
	}
}

func (c *connection) onSettings(f *http2.SettingsFrame) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if value, ok := f.Value(http2.SettingInitialWindowSize); ok {
		delta := int64(value) - c.initial
		c.initial = int64(value)
		for i, w := range c.windows {
			if w >= 0 {
				c.windows[i] = w + delta
			}
		}
	}
	c.fr.WriteSettingsAck()
	c.flushLocked()
	if !c.settled {
		c.settled = true
		close(c.ready)
	}
}

func (c *connection) onWindowUpdate(sid uint32, increment int64) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if sid == 0 {
		c.window += increment
	} else if i := int(sid >> 1); i < len(c.windows) && c.windows[i] >= 0 {
		c.windows[i] += increment
	}
	held := c.held
	c.held = nil
	for _, h := range held {
		c.sendLocked(h.sid, h.message)
	}
}

func (c *connection) ended(sid uint32) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if i := int(sid >> 1); i < len(c.windows) {
		c.windows[i] = -1
	}
}

func (c *connection) close() {
	c.wmu.Lock()
	c.closing = true
	c.flushLocked()
	c.wmu.Unlock()
	c.conn.Close()
}

// ------------------------------------------------------------------ main

func main() {
	server := flag.String("server", "", "the server's host:port")
	streams := flag.Int("streams", 5000, "streams in all")
	firstPhase := flag.Int("first-phase", 1, "streams opened first (the parent reads the "+
		"server's memory with these open)")
	channels := flag.Int("channels", 50, "connections the streams are spread over")
	endpoints := flag.Int("endpoints", 10, "endpoints of the target's CLA at an even change")
	target := flag.String("target", "", "the EDS resource the streams subscribe to")
	corrupt := flag.Int("corrupt-run", 0, "hand one stream change N-1's message in place of N's")
	flag.Parse()
	if *server == "" || *target == "" || *channels < 1 || *firstPhase > *streams {
		fail("usage: -server HOST:PORT -target NAME [-streams N -first-phase N -channels N]")
	}
	arr := &arrivals{streams: *streams, received: map[int]int{}, firstAt: map[int]float64{},
		wrong: map[int]int{}, out: bufio.NewWriter(os.Stdout)}
	check := &checker{known: map[int]*knownChange{}, target: *target, endpoints: *endpoints}
	conns := make([]*connection, *channels)
	for i := range conns {
		conns[i] = dial(i, *server, check, arr, *corrupt)
		<-conns[i].ready
	}
	commands := bufio.NewReader(os.Stdin)
	started := 0
	for _, goal := range []int{*firstPhase, *streams} {
		ready := arr.expect(goal)
		for i := started; i < goal; i++ {
			first, err := proto.Marshal(&discovery.DiscoveryRequest{
				Node: nodeNamed(fmt.Sprintf("bench-%d", i)), ResourceNames: []string{*target},
				TypeUrl: edsType})
			if err != nil {
				fail("encoding a request: %v", err)
			}
			conns[i%len(conns)].open(first)
		}
		for _, c := range conns {
			c.flush()
		}
		started = goal
		select {
		case <-ready:
		case <-time.After(300 * time.Second):
			fail("%d streams not open after 300 s", goal)
		}
		arr.mu.Lock()
		arr.line(`{"ready": %d}`, goal)
		arr.mu.Unlock()
		// The next streams open only once the parent has read the server's memory
		// with exactly these open.
		if _, err := commands.ReadString('\n'); err != nil {
			break
		}
	}
	io.Copy(io.Discard, commands) // until the parent closes stdin
	for _, c := range conns {
		c.close()
	}
	fmt.Fprintf(os.Stderr, "sotw-client: %d responses decoded in full, the rest compared "+
		"by their bytes\n", check.decoded.Load())
}
