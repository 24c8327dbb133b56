package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"golang.org/x/net/netutil"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/guard"
	"github.com/ortbus/ortbus/subjects"
	"github.com/ortbus/ortbus/telemetry"
)

// Limits of the HTTP server that do not depend on the configuration. The write timeout
// and the number of connections do: see httpWriteTimeout and httpMaxConns.
const (
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 30 * time.Second // headers and body, where httpBodyTimeout is not set
	// httpBodyTimeout bounds the reading of an API request's body, from when its handler
	// starts (its headers read): a client that sends its body slowly holds its connection
	// (bounded by httpMaxConns) for at most this long, and never a concurrency slot, which a
	// request takes only once its body is read. Else 408.
	httpBodyTimeout    = 10 * time.Second
	httpIdleTimeout    = 2 * time.Minute
	httpMaxHeaderBytes = 64 << 10
	// httpWriteMargin is added to the longest class max_timeout: a request answered at
	// its deadline still has its answer written.
	httpWriteMargin = 30 * time.Second
	// httpMinConns and httpConnsPerSlot make httpMaxConns.
	httpMinConns     = 64
	httpConnsPerSlot = 4
)

// httpAPI is the HTTP face of the client API, with the guards every request passes, in
// this order:
//
//   - Host must name this gateway (DNS rebinding): the listen address as bound; on
//     loopback also localhost, 127.0.0.1 and [::1] with its port; bound to every address,
//     any IP literal (and localhost) with its port; and gateway.http_hosts. Else 421.
//   - A method other than GET and HEAD sent by another site's page is refused (403,
//     crossSite).
//   - With a token (gateway.http_token_file, or ORTBUS_HTTP_TOKEN), every route but
//     /healthz and the page's files (page.go) needs `Authorization: Bearer TOKEN`: the
//     operator's, or an HTTP account's (httpcaller.go). Else 401.
//   - A route takes the path and method: else 404, or 405 for a known path (notFound).
//   - The API routes (op), in this order: a POST body must be `Content-Type:
//     application/json` (else 415: a cross-site "simple" request, text/plain or a form,
//     cannot run work), at most gateway.http_max_body bytes (else 413), and arrive in
//     full within httpBodyTimeout (else 408); then at most gateway.http_max_concurrent
//     API requests are served at once (else 429 overloaded, at once). A request takes its
//     slot only once its body is read, so that slow senders cannot hold the slots.
//
// Before any of them, the listener keeps at most httpMaxConns connections open (more
// wait in the listen backlog), and the server bounds the headers (httpReadHeaderTimeout,
// httpMaxHeaderBytes). Every error is a JSON {code, message, details} body with a stable
// code; a request whose client goes away is cancelled.
type httpAPI struct {
	// What it needs of the rest of the gateway, wired at construction (newHTTPAPI).
	svc httpService
	log *slog.Logger
	cfg *config.Config // the configuration it was built under: its limits

	mux   *http.ServeMux
	port  string          // the bound port
	anyIP bool            // bound to the unspecified address
	exact map[string]bool // Host values host:port, lower-case
	names map[string]bool // host names accepted on any port (http_hosts without a port)
	token []byte          // SHA-256 of the operator's bearer token; nil: none required
	// accounts are the HTTP accounts' tokens (httpcaller.go); only with token.
	accounts []httpAccount
	// events serves the page's snapshots and event streams (events.go).
	events  *eventStreams
	maxBody int64
	// bodyTimeout is httpBodyTimeout (shorter in tests).
	bodyTimeout time.Duration
	slots       chan struct{} // one per API request being served (its body read)
	// reading is the bytes of bodies being read now, over every connection; bodyBudget
	// bounds it (see budgetReader).
	reading    atomic.Int64
	bodyBudget int64
}

// httpService is what the HTTP API asks of the gateway: its service functions, wired
// at construction (newHTTPAPI), as the budget's view of the gateway is.
type httpService struct {
	// serve serves one request of the client API (api.go) from account ("" the
	// operator: httpcaller.go), answering through reply.
	serve func(ctx context.Context, op string, data []byte, asJSON bool, account string, reply Reply)
	// cancelAbandoned cancels request id of account, whose HTTP client went away, if it
	// is still unanswered (an answered one is not remembered as cancelled: a retry with
	// the same id must run).
	cancelAbandoned func(id, account string)
	// notReady says why the gateway should not be sent requests (GET /readyz), nil when
	// it is ready.
	notReady func() *codec.Error
	// metrics serves GET /metrics.
	metrics http.Handler
}

// errBodyBudget fails a body's read when the bodies being read would pass the budget.
var errBodyBudget = errors.New("the gateway is reading its budget of HTTP bodies")

// budgetReader takes a's body budget as a body's bytes arrive, so that the bodies being
// read at once — up to httpMaxConns of them, each up to http_max_body — hold at most
// bodyBudget bytes ((http_max_concurrent + 1) × http_max_body: what the bodies of the
// requests in their slots may hold too, and one more body, so that a body alone never
// passes it before it passes http_max_body, which is answered 413). A client that sends
// slowly holds only what it sent.
// release gives the bytes back once the body is read: it then lives under its slot.
type budgetReader struct {
	a    *httpAPI
	r    io.Reader
	held int64
}

func (b *budgetReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if n > 0 {
		if b.a.reading.Add(int64(n)) > b.a.bodyBudget {
			b.a.reading.Add(-int64(n))
			return 0, errBodyBudget
		}
		b.held += int64(n)
	}
	return n, err
}

func (b *budgetReader) release() { b.a.reading.Add(-b.held); b.held = 0 }

// serveHTTP serves the same API as JSON over HTTP (on a loopback address by default):
// POST /v1/<op>, POST /v1/job/<verb>, GET /v1/job/list, GET /v1/status, GET /v1/health,
// GET /healthz, GET /readyz, GET /metrics; and the page: GET / and its files, GET
// /v1/snapshot, GET /v1/events (page.go, events.go).
// It returns the server (nil when HTTP is off) and its bound address.
func serveHTTP(g *Gateway, override string) (*http.Server, string, error) {
	c := g.conf()
	addr := c.Gateway.HTTPListen
	if override != "" {
		addr = override
	}
	if addr == "" || addr == "-" {
		return nil, "", nil
	}
	token, err := httpToken(c.Gateway.HTTPTokenFile)
	if err != nil {
		return nil, "", err
	}
	accounts, err := httpAccounts(c, token)
	if err != nil {
		return nil, "", err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", err
	}
	a := newHTTPAPI(g, addr, ln.Addr(), token)
	a.accounts = accounts
	srv := startHTTP(a.cfg, a.log, ln, a)
	srv.RegisterOnShutdown(a.events.close) // the event streams end: nothing else would
	return srv, ln.Addr().String(), nil
}

// startHTTP serves h on ln, with the server's limits, until the server is closed. At
// most httpMaxConns connections are open at once (idle keep-alive ones included): the
// next one is accepted when one closes, and waits in the listen backlog meanwhile. Each
// request's headers are bounded in time and size; its body by op. c gives the limits
// that depend on the configuration.
func startHTTP(c *config.Config, log *slog.Logger, ln net.Listener, h http.Handler) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      httpWriteTimeout(c),
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	go srv.Serve(netutil.LimitListener(ln, httpMaxConns(c)))
	return srv
}

// httpMaxConns bounds the open HTTP connections: httpConnsPerSlot per concurrency slot
// (room for the clients reading their answers, sending their bodies or idle between
// requests), at least httpMinConns.
func httpMaxConns(c *config.Config) int {
	return max(httpMinConns, httpConnsPerSlot*c.Gateway.HTTPMaxConcurrent)
}

// httpWriteTimeout is longer than any request may take: the longest class timeout or
// max_timeout, or a lease acquire's longest wait, plus the time to read the request, plus
// a margin.
func httpWriteTimeout(c *config.Config) time.Duration {
	longest := codec.MaxLeaseWaitMS * time.Millisecond
	for _, cl := range c.Classes {
		longest = max(longest, cl.Timeout.D(), cl.MaxTimeout.D())
	}
	return longest + httpReadTimeout + httpWriteMargin
}

// httpToken reads the bearer token: the file's content when file is set (it must exist
// and not be empty), else ORTBUS_HTTP_TOKEN; nil when neither gives one. Only its hash
// is kept, so that comparing takes the same time whatever the length of a guess.
func httpToken(file string) ([]byte, error) {
	if file != "" {
		sum, err := httpTokenFile(file)
		if err != nil {
			return nil, fmt.Errorf("gateway.http_token_file: %w", err)
		}
		return sum, nil
	}
	tok := strings.TrimSpace(os.Getenv(config.HTTPTokenEnv))
	if tok == "" {
		return nil, nil
	}
	sum := sha256.Sum256([]byte(tok))
	return sum[:], nil
}

// httpTokenFile is the SHA-256 of the token file holds: it must exist and not be empty.
func httpTokenFile(file string) ([]byte, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return nil, fmt.Errorf("%s is empty", file)
	}
	sum := sha256.Sum256([]byte(tok))
	return sum[:], nil
}

// newHTTPAPI builds the handler of gateway g for a listener bound at bound, from the
// listen address as configured (addr, whose host may be a name), under g's configuration
// in force: it takes from g only its service functions (httpService), its logger and that
// configuration.
func newHTTPAPI(g *Gateway, addr string, bound net.Addr, token []byte) *httpAPI {
	c := g.conf()
	a := &httpAPI{
		svc: httpService{
			serve: g.serve,
			cancelAbandoned: func(id, account string) {
				g.d.cancel(accountScopedID(account, id), httpOwner(account), account, true)
			},
			notReady: func() *codec.Error {
				return notReady(g.nc, func() int { return g.health().Workers }, g.jobs)
			},
			metrics: promHandler(g.metrics.reg),
		},
		log:     g.log,
		cfg:     c,
		exact:   map[string]bool{},
		names:   map[string]bool{},
		token:   token,
		maxBody: int64(c.Gateway.HTTPMaxBody),
		slots:   make(chan struct{}, max(1, c.Gateway.HTTPMaxConcurrent)),

		bodyTimeout: httpBodyTimeout,
		bodyBudget:  int64(max(1, c.Gateway.HTTPMaxConcurrent)+1) * int64(c.Gateway.HTTPMaxBody),
	}
	var ip net.IP
	if tcp, ok := bound.(*net.TCPAddr); ok {
		ip, a.port = tcp.IP, strconv.Itoa(tcp.Port)
	} else {
		_, a.port, _ = net.SplitHostPort(bound.String())
	}
	add := func(host string) { a.exact[strings.ToLower(net.JoinHostPort(host, a.port))] = true }
	if ip != nil {
		add(ip.String())
		switch {
		case ip.IsLoopback():
			add("localhost")
			add("127.0.0.1")
			add("::1")
		case ip.IsUnspecified():
			a.anyIP = true
			add("localhost")
		}
	}
	if host, _, err := net.SplitHostPort(addr); err == nil && host != "" {
		add(host)
	}
	for _, h := range c.Gateway.HTTPHosts {
		if host, port, err := net.SplitHostPort(h); err == nil {
			a.exact[strings.ToLower(net.JoinHostPort(host, port))] = true
		} else {
			a.names[strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"))] = true
		}
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if e := a.svc.notReady(); e != nil {
			httpError(w, http.StatusServiceUnavailable, e)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ready\n")
	})
	mux.Handle("GET /metrics", a.svc.metrics)
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) { a.op(w, r, subjects.OpStatus) })
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) { a.op(w, r, subjects.OpHealth) })
	mux.HandleFunc("POST /v1/{op}", func(w http.ResponseWriter, r *http.Request) { a.op(w, r, r.PathValue("op")) })
	mux.HandleFunc("POST /v1/job/{verb}", func(w http.ResponseWriter, r *http.Request) { a.op(w, r, "job."+r.PathValue("verb")) })
	mux.HandleFunc("GET /v1/job/list", func(w http.ResponseWriter, r *http.Request) { a.op(w, r, subjects.OpJobList) })
	mux.HandleFunc("POST /v1/cache/{verb}", func(w http.ResponseWriter, r *http.Request) { a.op(w, r, "cache."+r.PathValue("verb")) })
	a.events = newEventStreams(a, classHistories(g), httpMaxConns(c)/4)
	mux.HandleFunc("GET /v1/snapshot", a.events.serveSnapshot)
	mux.HandleFunc("GET /v1/events", a.events.serveStream)
	mux.HandleFunc("GET /{$}", servePage)
	mux.HandleFunc("GET /page/{file}", servePageFile)
	mux.HandleFunc("/", a.notFound)
	a.mux = mux
	return a
}

// ServeHTTP applies the guards, then routes.
func (a *httpAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer guard.Recover(a.log, "http "+r.Method+" "+r.URL.Path, func(e *codec.Error) {
		httpError(w, e.Code.Status(), e)
	})
	if !a.hostAllowed(r.Host) {
		httpError(w, http.StatusMisdirectedRequest, codec.Errorf(codec.CodeBadRequest,
			"Host %q is not this gateway's address (add the name to gateway.http_hosts)", truncate(r.Host, 256)))
		return
	}
	if !safeMethod(r.Method) && crossSite(r) {
		httpError(w, http.StatusForbidden, codec.Errorf(codec.CodeBadRequest,
			"a request from another site's page (Origin %q, Sec-Fetch-Site %q) may not change anything here",
			truncate(r.Header.Get("Origin"), 256), truncate(r.Header.Get("Sec-Fetch-Site"), 32)))
		return
	}
	account, ok := a.caller(r)
	if !ok && !publicPath(r.URL.Path) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="ortbus"`)
		httpError(w, http.StatusUnauthorized, codec.Errorf(codec.CodeBadRequest, "missing or wrong bearer token (Authorization: Bearer TOKEN)"))
		return
	}
	a.mux.ServeHTTP(w, withCaller(r, account))
}

// notReady says why this gateway should not be sent requests (GET /readyz answers it
// 503), or nil when it is ready:
//   - its NATS connection is not CONNECTED (connecting, reconnecting, draining, closed):
//     no request reaches a worker, no job item arrives;
//   - no pool has a live worker;
//   - the job store is expected and not open yet (jobService.opening).
//
// nc is the gateway's connection, live counts the live workers, js is the job service.
func notReady(nc *nats.Conn, live func() int, js *jobService) *codec.Error {
	if nc == nil {
		return codec.Errorf(codec.CodeUnavailable, "not connected to NATS")
	}
	if st := nc.Status(); st != nats.CONNECTED {
		return codec.Errorf(codec.CodeUnavailable, "the NATS connection is %s", st).With("nats", st.String())
	}
	if live() == 0 {
		return codec.Errorf(codec.CodeNoWorker, "no live workers")
	}
	if e := js.opening(); e != nil {
		return e
	}
	return nil
}

// hostAllowed reports whether a Host header names this gateway.
func (a *httpAPI) hostAllowed(h string) bool {
	h = strings.ToLower(h)
	if h == "" {
		return false
	}
	if a.exact[h] {
		return true
	}
	host, port, err := net.SplitHostPort(h)
	if err != nil {
		// No port: the scheme's default.
		host, port = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"), "80"
		if a.exact[net.JoinHostPort(host, port)] {
			return true
		}
	}
	if a.names[host] {
		return true
	}
	// An IP literal cannot be rebound to another address.
	return a.anyIP && port == a.port && net.ParseIP(host) != nil
}

// notFound answers what no route takes: 405 for a known path with another method, else
// 404, both as JSON errors.
func (a *httpAPI) notFound(w http.ResponseWriter, r *http.Request) {
	allow := ""
	switch p := r.URL.Path; {
	case p == "/v1/status" || p == "/v1/health":
		allow = "GET, HEAD, POST"
	case p == "/healthz" || p == "/readyz" || p == "/metrics" || p == "/v1/snapshot" || p == "/v1/events" || publicPath(p):
		allow = "GET, HEAD"
	case strings.HasPrefix(p, "/v1/") && !strings.Contains(p[len("/v1/"):], "/"):
		allow = "POST"
	}
	if allow != "" && !slices.Contains(strings.Split(allow, ", "), r.Method) {
		w.Header().Set("Allow", allow)
		httpError(w, http.StatusMethodNotAllowed, codec.Errorf(codec.CodeBadRequest, "method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allow))
		return
	}
	httpError(w, http.StatusNotFound, codec.Errorf(codec.CodeUnknownOp, "no route %s %s (the API is POST /v1/<op>)", r.Method, truncate(r.URL.Path, 256)))
}

// httpResult is the terminal answer of one request.
type httpResult struct {
	body []byte
	err  *codec.Error
}

// op serves one API request. A request whose client goes away before its answer is
// cancelled (the id it carries, or the one given to it here); the answer that comes
// later is dropped.
func (a *httpAPI) op(w http.ResponseWriter, r *http.Request, op string) {
	var body []byte
	if r.Method == http.MethodPost {
		if ct := r.Header.Get("Content-Type"); !jsonContentType(ct) {
			httpError(w, http.StatusUnsupportedMediaType, codec.Errorf(codec.CodeBadRequest,
				"want Content-Type: application/json, got %q", truncate(ct, 128)))
			return
		}
		var status int
		var e *codec.Error
		if body, status, e = a.readBody(w, r); e != nil {
			httpError(w, status, e)
			return
		}
	}
	// The concurrency bound counts requests whose body is read (a GET has none): a client
	// that sends its body slowly holds its connection, not a slot.
	select {
	case a.slots <- struct{}{}:
		defer func() { <-a.slots }()
	default:
		httpError(w, http.StatusTooManyRequests, codec.Errorf(codec.CodeOverloaded,
			"over %d HTTP requests in progress (gateway.http_max_concurrent)", cap(a.slots)))
		return
	}
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	id := ""
	if subjects.IsWork(op) {
		body, id = withID(body)
	}
	res := make(chan httpResult, 1)
	// The reply never touches w: it may come after this handler has returned.
	account := callerOf(r.Context())
	a.svc.serve(telemetry.ExtractHTTP(context.Background(), r.Header), op, body, true, account, func(b []byte, e *codec.Error) {
		select {
		case res <- httpResult{b, e}:
		default:
		}
	})
	select {
	case out := <-res:
		httpWrite(w, out)
	case <-r.Context().Done():
		select {
		case <-res: // answered meanwhile: nobody to tell
		default:
			if id != "" {
				a.svc.cancelAbandoned(id, account)
			}
		}
	}
}

// readBody reads r's body: at most a.maxBody bytes (else 413), all of it within
// a.bodyTimeout (else 408), within the body budget of budgetReader (else 429). It returns the status and error to answer on failure.
func (a *httpAPI) readBody(w http.ResponseWriter, r *http.Request) ([]byte, int, *codec.Error) {
	if r.Body == nil || r.Body == http.NoBody {
		// Nothing to read. No deadline is set either: the server already watches the
		// connection for the client going away, and a read that timed out there would
		// cancel the request.
		return nil, 0, nil
	}
	rc := http.NewResponseController(w)
	// A writer that cannot set one (a test's recorder) leaves the server's ReadTimeout.
	rc.SetReadDeadline(time.Now().Add(a.bodyTimeout))
	budget := &budgetReader{a: a, r: r.Body}
	defer budget.release()
	body, err := io.ReadAll(http.MaxBytesReader(w, io.NopCloser(budget), a.maxBody))
	if err != nil {
		if errors.Is(err, errBodyBudget) {
			return nil, http.StatusTooManyRequests, codec.Errorf(codec.CodeOverloaded,
				"the gateway is reading %d bytes of HTTP bodies, its bound ((http_max_concurrent + 1) × http_max_body); try again", a.bodyBudget).With("limit", a.bodyBudget)
		}
		// The deadline stays: what the server reads of the rest of the body after the
		// answer is bounded too.
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, http.StatusRequestEntityTooLarge, codec.Errorf(codec.CodeBadRequest,
				"body over %d bytes (gateway.http_max_body)", a.maxBody).With("limit", a.maxBody)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, http.StatusRequestTimeout, codec.Errorf(codec.CodeBadRequest,
				"the body did not arrive within %v", a.bodyTimeout)
		}
		return nil, http.StatusBadRequest, codec.Errorf(codec.CodeBadRequest, "reading the body: %v", err)
	}
	// No deadline while the request is served (net/http clears it too, when it starts
	// watching for the client going away at the body's end): a read that timed out would
	// cancel the request as abandoned.
	rc.SetReadDeadline(time.Time{})
	return body, 0, nil
}

// withID returns the request's id, giving it one when it has none. A body that does not
// decode is returned as it is (its error is answered as for any request).
func withID(body []byte) ([]byte, string) {
	var req codec.Request
	if codec.Decode(body, &req, true) != nil {
		return body, ""
	}
	if req.ID != "" {
		return body, req.ID
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil || m == nil {
		return body, ""
	}
	for k := range m {
		if strings.EqualFold(k, "id") { // encoding/json matches keys case-insensitively
			delete(m, k)
		}
	}
	id := nuid.Next()
	m["id"], _ = json.Marshal(id)
	b, err := json.Marshal(m)
	if err != nil {
		return body, ""
	}
	return b, id
}

// jsonContentType accepts application/json with parameters (a charset only if UTF-8).
func jsonContentType(ct string) bool {
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != codec.ContentTypeJSON {
		return false
	}
	cs, ok := params["charset"]
	return !ok || strings.EqualFold(cs, "utf-8") || strings.EqualFold(cs, "utf8")
}

// httpWrite writes a result or an error.
func httpWrite(w http.ResponseWriter, out httpResult) {
	if out.err != nil {
		httpError(w, out.err.Code.Status(), out.err)
		return
	}
	h := w.Header()
	h.Set(codec.HeaderContentType, codec.ContentTypeJSON)
	h.Set("X-Content-Type-Options", "nosniff")
	w.Write(out.body)
}

// httpError writes e as a JSON {code, message, details} body with status.
func httpError(w http.ResponseWriter, status int, e *codec.Error) {
	b, err := json.Marshal(e)
	if err != nil {
		// Details that do not encode (they never come from the wire) are dropped.
		b, _ = json.Marshal(&codec.Error{Code: e.Code, Message: e.Message})
	}
	h := w.Header()
	h.Set(codec.HeaderContentType, codec.ContentTypeJSON)
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// truncate keeps an echoed client value short.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
