package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/jobs"
)

// testHTTPAPI is the HTTP handler of a gateway that is not started: enough for the
// guards, which answer before any request reaches the queues.
func testHTTPAPI(t *testing.T, gatewayTOML, listen string, bound net.Addr, token string) *httpAPI {
	t.Helper()
	c, err := config.Parse([]byte("[nats]\nembedded = true\n[gateway]\n"+gatewayTOML+"\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	g := gatewayWith(c, &Gateway{log: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: &metrics{reg: prometheus.NewRegistry()}})
	var sum []byte
	if token != "" {
		s, err := httpTokenFrom(t, token)
		if err != nil {
			t.Fatal(err)
		}
		sum = s
	}
	return newHTTPAPI(g, listen, bound, sum)
}

func httpTokenFrom(t *testing.T, token string) ([]byte, error) {
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return httpToken(p)
}

func tcpAddr(ip string, port int) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: port} }

func TestHTTPHostAllowed(t *testing.T) {
	loop := testHTTPAPI(t, `http_hosts = ["ortbus.internal", "gw.example:9000"]`, "127.0.0.1:0", tcpAddr("127.0.0.1", 8080), "")
	for h, want := range map[string]bool{
		"127.0.0.1:8080":       true,
		"localhost:8080":       true,
		"LOCALHOST:8080":       true,
		"[::1]:8080":           true,
		"ortbus.internal":      true,
		"ortbus.internal:8080": true,
		"gw.example:9000":      true,
		"gw.example:8080":      false,
		"gw.example":           false,
		"127.0.0.1:8081":       false,
		"localhost":            false, // port 80
		"evil.example:8080":    false,
		"10.1.2.3:8080":        false,
		"":                     false,
	} {
		if got := loop.hostAllowed(h); got != want {
			t.Errorf("loopback listener: Host %q allowed %v, want %v", h, got, want)
		}
	}
	named := testHTTPAPI(t, "", "localhost:80", tcpAddr("127.0.0.1", 80), "")
	if !named.hostAllowed("localhost") || !named.hostAllowed("127.0.0.1") {
		t.Errorf("port 80: Host without a port not allowed")
	}
	all := testHTTPAPI(t, "", "0.0.0.0:8080", tcpAddr("0.0.0.0", 8080), "")
	for h, want := range map[string]bool{
		"10.1.2.3:8080":        true, // an IP literal cannot be rebound
		"[fe80::1]:8080":       true,
		"localhost:8080":       true,
		"10.1.2.3:8081":        false,
		"rebind.example:8080":  false,
		"10.1.2.3.nip.io:8080": false,
	} {
		if got := all.hostAllowed(h); got != want {
			t.Errorf("wildcard listener: Host %q allowed %v, want %v", h, got, want)
		}
	}
}

func TestHTTPJSONContentType(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json":                  true,
		"application/json; charset=utf-8":   true,
		"Application/JSON; charset=UTF-8":   true,
		"application/json; charset=latin-1": false,
		"text/plain":                        false,
		"application/x-www-form-urlencoded": false,
		"multipart/form-data; boundary=x":   false,
		"application/jsonx":                 false,
		"":                                  false,
	} {
		if got := jsonContentType(ct); got != want {
			t.Errorf("Content-Type %q: %v, want %v", ct, got, want)
		}
	}
}

func TestHTTPWithID(t *testing.T) {
	b, id := withID([]byte(`{"path":"/x.png","id":"mine"}`))
	if id != "mine" || string(b) != `{"path":"/x.png","id":"mine"}` {
		t.Errorf("a request with an id: %s %q", b, id)
	}
	for _, in := range []string{`{"path":"/x.png"}`, `{"path":"/x.png","id":""}`, `{"path":"/x.png","ID":""}`, `{}`} {
		b, id := withID([]byte(in))
		var req codec.Request
		if err := codec.Decode(b, &req, true); err != nil || id == "" || req.ID != id {
			t.Errorf("%s: got %s id %q (decoded id %q, %v)", in, b, id, req.ID, err)
		}
	}
	for _, in := range []string{`not json`, `[1,2]`, `null`, `{"id":7}`} {
		if b, id := withID([]byte(in)); id != "" || string(b) != in {
			t.Errorf("%s: got %s id %q, want it unchanged", in, b, id)
		}
	}
}

func TestHTTPToken(t *testing.T) {
	t.Setenv(config.HTTPTokenEnv, "")
	if tok, err := httpToken(""); tok != nil || err != nil {
		t.Errorf("no token: %v %v", tok, err)
	}
	t.Setenv(config.HTTPTokenEnv, "from-env")
	env, err := httpToken("")
	if err != nil || env == nil {
		t.Fatalf("token from the environment: %v %v", env, err)
	}
	file, err := httpTokenFrom(t, "from-file")
	if err != nil || string(file) == string(env) {
		t.Errorf("the file's token must win over the environment's: %v", err)
	}
	if _, err := httpToken(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing token file was accepted")
	}
	if _, err := httpTokenFrom(t, "  "); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("an empty token file: %v", err)
	}
}

// TestHTTPGuards drives the handler: every refusal is a JSON error with a stable code.
func TestHTTPGuards(t *testing.T) {
	a := testHTTPAPI(t, `http_max_body = "1KiB"`+"\nhttp_max_concurrent = 2", "127.0.0.1:0", tcpAddr("127.0.0.1", 8080), "s3cret")
	type tc struct {
		name, method, path, host, auth, ctype, body string
		status                                      int
		code                                        codec.Code
	}
	const ok, ctJSON = "Bearer s3cret", "application/json"
	big := `{"path":"` + strings.Repeat("a", 2000) + `"}`
	for _, c := range []tc{
		{"healthz needs no token", "GET", "/healthz", "127.0.0.1:8080", "", "", "", 200, ""},
		{"healthz checks the host", "GET", "/healthz", "evil.example:8080", "", "", "", 421, codec.CodeBadRequest},
		{"wrong host", "POST", "/v1/tag", "evil.example:8080", ok, ctJSON, `{}`, 421, codec.CodeBadRequest},
		{"no token", "POST", "/v1/tag", "127.0.0.1:8080", "", ctJSON, `{}`, 401, codec.CodeBadRequest},
		{"wrong token", "POST", "/v1/tag", "127.0.0.1:8080", "Bearer s3cre", ctJSON, `{}`, 401, codec.CodeBadRequest},
		{"metrics need the token", "GET", "/metrics", "localhost:8080", "", "", "", 401, codec.CodeBadRequest},
		{"metrics with the token", "GET", "/metrics", "localhost:8080", ok, "", "", 200, ""},
		{"text/plain", "POST", "/v1/tag", "127.0.0.1:8080", ok, "text/plain", `{}`, 415, codec.CodeBadRequest},
		{"form", "POST", "/v1/tag", "127.0.0.1:8080", ok, "application/x-www-form-urlencoded", `a=b`, 415, codec.CodeBadRequest},
		{"no content type", "POST", "/v1/tag", "127.0.0.1:8080", ok, "", `{}`, 415, codec.CodeBadRequest},
		{"body too large", "POST", "/v1/tag", "127.0.0.1:8080", ok, ctJSON, big, 413, codec.CodeBadRequest},
		{"unknown op", "POST", "/v1/nosuch", "127.0.0.1:8080", ok, ctJSON + "; charset=utf-8", `{}`, 404, codec.CodeUnknownOp},
		{"unknown route", "GET", "/nowhere", "127.0.0.1:8080", ok, "", "", 404, codec.CodeUnknownOp},
		{"wrong method", "GET", "/v1/tag", "127.0.0.1:8080", ok, "", "", 405, codec.CodeBadRequest},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(c.method, "http://"+c.host+c.path, strings.NewReader(c.body))
			r.Host = c.host
			if c.auth != "" {
				r.Header.Set("Authorization", c.auth)
			}
			if c.ctype != "" {
				r.Header.Set("Content-Type", c.ctype)
			}
			w := httptest.NewRecorder()
			a.ServeHTTP(w, r)
			if w.Code != c.status {
				t.Fatalf("status %d, want %d: %s", w.Code, c.status, w.Body)
			}
			if c.code == "" {
				return
			}
			checkJSONError(t, w, c.code)
			if c.status == 401 && w.Header().Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
		})
	}

	t.Run("concurrency bound", func(t *testing.T) {
		a.slots <- struct{}{}
		a.slots <- struct{}{}
		defer func() { <-a.slots; <-a.slots }()
		r := httptest.NewRequest("POST", "http://127.0.0.1:8080/v1/nosuch", strings.NewReader(`{}`))
		r.Header.Set("Authorization", ok)
		r.Header.Set("Content-Type", ctJSON)
		w := httptest.NewRecorder()
		a.ServeHTTP(w, r)
		if w.Code != http.StatusTooManyRequests {
			t.Fatalf("status %d with every slot taken, want 429: %s", w.Code, w.Body)
		}
		checkJSONError(t, w, codec.CodeOverloaded)
	})
}

func checkJSONError(t *testing.T, w *httptest.ResponseRecorder, code codec.Code) {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != codec.ContentTypeJSON {
		t.Errorf("Content-Type %q, want %s", ct, codec.ContentTypeJSON)
	}
	var e codec.Error
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Code != code || e.Message == "" {
		t.Errorf("body %q (%v), want a JSON error with code %s and a message", w.Body, err, code)
	}
}

// httpTestWait bounds a wait of these tests on the server, so that a failure does not
// hang the run: it is never the measure of a result.
const httpTestWait = time.Minute

// serveTestHTTP serves h on ln with the gateway's server and limits (startHTTP) until
// the test ends.
func serveTestHTTP(t *testing.T, a *httpAPI, ln net.Listener, h http.Handler) {
	t.Helper()
	srv := startHTTP(a.cfg, a.log, ln, h)
	t.Cleanup(func() { srv.Close() })
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// rawConn is a client connection that writes an HTTP/1.1 request by hand, a piece at a
// time, and reads its response.
type rawConn struct {
	t    *testing.T
	conn net.Conn
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(httpTestWait))
	return &rawConn{t: t, conn: c}
}

func (c *rawConn) write(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.conn, s); err != nil {
		c.t.Fatal(err)
	}
}

func (c *rawConn) response() (*http.Response, []byte) {
	c.t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(c.conn), nil)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp, b
}

// checkJSONBody is checkJSONError on a response read from the wire.
func checkJSONBody(t *testing.T, resp *http.Response, body []byte, status int, code codec.Code) {
	t.Helper()
	w := httptest.NewRecorder()
	w.Code = resp.StatusCode
	maps.Copy(w.Header(), resp.Header)
	w.Body.Write(body)
	if w.Code != status {
		t.Fatalf("status %d, want %d: %s", w.Code, status, body)
	}
	checkJSONError(t, w, code)
}

// readNotifier sends on read each time a read of the body it wraps returns bytes.
type readNotifier struct {
	io.ReadCloser
	read chan<- struct{}
}

func (b readNotifier) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.read <- struct{}{}
	}
	return n, err
}

// TestHTTPSlowBodies: http_max_concurrent clients that send their bodies one byte at a
// time hold no concurrency slot: a request sent meanwhile is served (here answered
// unknown_op: the op is not one, and no NATS is needed), not refused 429. Each slow one
// is served too once its body is in.
func TestHTTPSlowBodies(t *testing.T) {
	const slots = 2
	ln := listenLoopback(t)
	a := testHTTPAPI(t, fmt.Sprintf("http_max_concurrent = %d", slots), "127.0.0.1:0", ln.Addr(), "")
	read := make(chan struct{}, 64) // more than the bytes of every body of the test
	serveTestHTTP(t, a, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != http.NoBody {
			r.Body = readNotifier{r.Body, read}
		}
		a.ServeHTTP(w, r)
	}))
	addr := ln.Addr().String()
	waitRead := func(what string) {
		t.Helper()
		select {
		case <-read:
		case <-time.After(httpTestWait):
			t.Fatalf("the server never read %s", what)
		}
	}

	const body = `{"a":1}`
	slow := make([]*rawConn, slots)
	for i := range slow {
		slow[i] = dialRaw(t, addr)
		slow[i].write(fmt.Sprintf("POST /v1/nosuch HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			addr, len(body), body[:1]))
		waitRead(fmt.Sprintf("slow client %d's first byte", i))
	}
	// One more byte each, one at a time, the last one kept back.
	for k := 1; k < len(body)-1; k++ {
		for i, c := range slow {
			c.write(body[k : k+1])
			waitRead(fmt.Sprintf("slow client %d's byte %d", i, k))
		}
	}

	resp, b := postJSON(t, addr, "/v1/nosuch", `{}`)
	if resp.StatusCode == http.StatusTooManyRequests {
		t.Fatalf("a whole request while %d clients send their bodies slowly: 429 %s", slots, b)
	}
	checkJSONBody(t, resp, b, http.StatusNotFound, codec.CodeUnknownOp)

	for _, c := range slow {
		c.write(body[len(body)-1:])
		resp, b := c.response()
		checkJSONBody(t, resp, b, http.StatusNotFound, codec.CodeUnknownOp)
	}
}

// TestHTTPSlowBodyTimeout: a body that does not arrive in full within the body timeout
// is answered 408 (the op, which would answer anything else, never runs).
func TestHTTPSlowBodyTimeout(t *testing.T) {
	ln := listenLoopback(t)
	a := testHTTPAPI(t, "http_max_concurrent = 1", "127.0.0.1:0", ln.Addr(), "")
	a.bodyTimeout = 50 * time.Millisecond
	serveTestHTTP(t, a, ln, a)
	addr := ln.Addr().String()
	c := dialRaw(t, addr)
	c.write(fmt.Sprintf("POST /v1/tag HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{", addr))
	resp, b := c.response()
	checkJSONBody(t, resp, b, http.StatusRequestTimeout, codec.CodeBadRequest)
}

// countingListener counts the connections accepted and not yet closed, and the most
// open at once; it sends on accepted at each accept.
type countingListener struct {
	net.Listener
	accepted   chan struct{}
	mu         sync.Mutex
	open, most int
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.open++
	l.most = max(l.most, l.open)
	l.mu.Unlock()
	l.accepted <- struct{}{}
	return &countedConn{Conn: c, l: l}, nil
}

func (l *countingListener) mostOpen() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.most
}

type countedConn struct {
	net.Conn
	l    *countingListener
	once sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.open--
		c.l.mu.Unlock()
	})
	return err
}

// TestHTTPConnBound: the server keeps at most httpMaxConns connections open. With that
// many open (idle, sending nothing), one more waits unaccepted, and is served once one
// of them closes.
func TestHTTPConnBound(t *testing.T) {
	inner := listenLoopback(t)
	a := testHTTPAPI(t, "http_max_concurrent = 2", "127.0.0.1:0", inner.Addr(), "")
	limit := httpMaxConns(a.cfg)
	if limit != httpMinConns {
		t.Fatalf("httpMaxConns with 2 slots: %d, want %d", limit, httpMinConns)
	}
	ln := &countingListener{Listener: inner, accepted: make(chan struct{}, 2*limit)}
	serveTestHTTP(t, a, ln, a)
	addr := inner.Addr().String()

	held := make([]*rawConn, limit)
	for i := range held {
		held[i] = dialRaw(t, addr)
	}
	for i := range limit {
		select {
		case <-ln.accepted:
		case <-time.After(httpTestWait):
			t.Fatalf("%d of %d connections accepted", i, limit)
		}
	}
	extra := dialRaw(t, addr)
	extra.write("GET /healthz HTTP/1.1\r\nHost: " + addr + "\r\nConnection: close\r\n\r\n")
	// Unbounded, the server has accepted extra as soon as it connected.
	held[0].conn.Close()
	resp, b := extra.response()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the connection over the bound, once one closed: %d %s", resp.StatusCode, b)
	}
	if most := ln.mostOpen(); most > limit {
		t.Errorf("%d connections open at once, want at most %d", most, limit)
	}
	if got := httpMaxConns(parseConfig(t, unitConfig)); got != httpConnsPerSlot*config.DefaultHTTPMaxConcurrent {
		t.Errorf("httpMaxConns with the default http_max_concurrent: %d", got)
	}
}

// TestHTTPReadyz: /readyz answers 503 while no worker is live, while the NATS connection
// is not connected, and while the job store is being opened; 200 otherwise, JetStream
// off included.
func TestHTTPReadyz(t *testing.T) {
	g := testGateway(t, unitConfig)
	a := newHTTPAPI(g, "127.0.0.1:0", tcpAddr("127.0.0.1", 8080), nil)
	readyz := func(what string, status int, code codec.Code) *httptest.ResponseRecorder {
		t.Helper()
		w := httptest.NewRecorder()
		a.ServeHTTP(w, httptest.NewRequest("GET", "http://127.0.0.1:8080/readyz", nil))
		if w.Code != status {
			t.Fatalf("%s: /readyz %d %s, want %d", what, w.Code, w.Body, status)
		}
		if code != "" {
			checkJSONError(t, w, code)
		}
		return w
	}
	readyz("no live worker", 503, codec.CodeNoWorker)
	f := newFleet(t, g)
	f.ready("fast", "fast-0", 1, "interactive")
	if w := readyz("a live worker", 200, ""); w.Body.String() != "ready\n" {
		t.Errorf("/readyz body %q", w.Body)
	}

	notOpen := codec.Errorf(codec.CodeUnavailable, "the job store is not open yet")
	g.jobs = &jobService{done: make(chan struct{}), why: notOpen}
	readyz("the job store being opened", 503, codec.CodeUnavailable)
	g.jobs.mu.Lock()
	g.jobs.why = jobs.Unavailable()
	g.jobs.mu.Unlock()
	readyz("a server without JetStream", 200, "")
	g.jobs.mu.Lock()
	g.jobs.why = notOpen
	g.jobs.mu.Unlock()
	close(g.jobs.done)
	readyz("the job store's opener stopped", 200, "")

	g.nc.Close()
	w := readyz("NATS closed", 503, codec.CodeUnavailable)
	if !strings.Contains(w.Body.String(), nats.CLOSED.String()) {
		t.Errorf("/readyz with NATS closed: %s, want it named", w.Body)
	}
}

// byteNotifier reports how many bytes each read of a body returned.
type byteNotifier struct {
	io.ReadCloser
	read chan<- int
}

func (b byteNotifier) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.read <- n
	}
	return n, err
}

// TestHTTPBodyBudget: the bodies being read at once hold at most (http_max_concurrent + 1)
// × http_max_body bytes. While two slow clients hold 1600 of a budget of 2048, a body of
// 600 is answered 429 overloaded, one of 300 is read and served; the slow bodies,
// completed, are served too, and every byte is given back. A body over http_max_body
// alone is 413, never 429.
func TestHTTPBodyBudget(t *testing.T) {
	ln := listenLoopback(t)
	a := testHTTPAPI(t, "http_max_concurrent = 1\nhttp_max_body = 1024", "127.0.0.1:0", ln.Addr(), "")
	if a.bodyBudget != 2048 {
		t.Fatalf("budget %d, want 2048", a.bodyBudget)
	}
	read := make(chan int, 4096)
	serveTestHTTP(t, a, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Slow") != "" && r.Body != http.NoBody {
			r.Body = byteNotifier{r.Body, read}
		}
		a.ServeHTTP(w, r)
	}))
	addr := ln.Addr().String()
	body := func(n int) string { return `{"a":"` + strings.Repeat("x", n-8) + `"}` }
	post := func(n int) (*http.Response, []byte) {
		t.Helper()
		return postJSON(t, addr, "/v1/nosuch", body(n))
	}
	resp, b := post(1025)
	checkJSONBody(t, resp, b, http.StatusRequestEntityTooLarge, codec.CodeBadRequest)

	full := body(1000)
	slow := make([]*rawConn, 2)
	for i := range slow {
		slow[i] = dialRaw(t, addr)
		slow[i].write(fmt.Sprintf("POST /v1/nosuch HTTP/1.1\r\nHost: %s\r\nX-Slow: 1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			addr, len(full), full[:800]))
	}
	for got := 0; got < 1600; {
		select {
		case n := <-read:
			got += n
		case <-time.After(httpTestWait):
			t.Fatalf("the server read %d of the slow bodies' first 1600 bytes", got)
		}
	}
	resp, b = post(600)
	checkJSONBody(t, resp, b, http.StatusTooManyRequests, codec.CodeOverloaded)
	resp, b = post(300)
	checkJSONBody(t, resp, b, http.StatusNotFound, codec.CodeUnknownOp)

	for _, c := range slow {
		c.write(full[800:])
		resp, b := c.response()
		checkJSONBody(t, resp, b, http.StatusNotFound, codec.CodeUnknownOp)
	}
	if n := a.reading.Load(); n != 0 {
		t.Fatalf("%d bytes of budget still taken after every body was read", n)
	}
}

// postJSON posts body as JSON to path on a fresh connection and returns the response and
// its whole body.
func postJSON(t *testing.T, addr, path, body string) (*http.Response, []byte) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: httpTestWait}
	resp, err := c.Post("http://"+addr+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}
