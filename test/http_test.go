package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nuid"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/subjects"
)

// httpMaxBody is the body limit of TestHTTP's gateway.
const httpMaxBody = 4096

// TestHTTP checks the guards of the gateway's HTTP API against one real gateway (one pool
// p of one worker, one slot, serving interactive and batch; a bearer token from a file;
// http_max_concurrent = 1; http_max_body = 4KiB; http_hosts = ["ortbus.test"]), with real
// HTTP calls, one subtest after the other.
func TestHTTP(t *testing.T) {
	root := imageRoot(t)
	red := colourPNG(t, root, "red")
	token := "tok-" + nuid.Next()
	tokenFile := filepath.Join(t.TempDir(), "http-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := gwConfig{
		Root:    root,
		Gateway: config.Gateway{HTTPTokenFile: tokenFile, HTTPMaxConcurrent: 1, HTTPMaxBody: httpMaxBody, HTTPHosts: []string{"ortbus.test"}},
		Pools:   []gwPool{{Name: "p", Version: "1.30.0", Classes: []string{"interactive", "batch"}, Models: []string{gwTagger, gwSlow}}},
		Classes: []gwClass{
			{Name: "interactive", Chain: []string{"p"}},
			{Name: "batch", Chain: []string{"p"}},
		},
	}.write(t)
	// A token in the environment too: the file's wins.
	g := launchGateway(t, cfg, true, "ORTBUS_HTTP_TOKEN=not-this-one")
	g.waitLive(t, "p", 1)
	c := &httpClient{addr: g.Ready.HTTP, token: token}
	_, port, _ := net.SplitHostPort(g.Ready.HTTP)
	tagBody := fmt.Sprintf(`{"path":%s,"model":%q}`, strconv.Quote(red), gwTagger)

	t.Run("JSONOnly", func(t *testing.T) {
		r := c.do(t, context.Background(), "POST", "/v1/tag", tagBody, withType("application/json; charset=utf-8"))
		if r.status != http.StatusOK {
			t.Fatalf("tag with application/json: %d %s", r.status, r.body)
		}
		var tr codec.TagReply
		if err := json.Unmarshal(r.body, &tr); err != nil || tr.Pool != "p" {
			t.Fatalf("tag reply %s (%v)", r.body, err)
		}
		before := c.counts(t)
		for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""} {
			r := c.do(t, context.Background(), "POST", "/v1/tag", tagBody, withType(ct))
			r.wantError(t, http.StatusUnsupportedMediaType, codec.CodeBadRequest)
		}
		// None of them ran: the gateway answered no request.
		if after := c.counts(t); httpSum(after, "op=tag,") != httpSum(before, "op=tag,") {
			t.Errorf("requests with a non-JSON body were counted by the gateway: %v -> %v", before, after)
		}
	})

	t.Run("Host", func(t *testing.T) {
		for host, want := range map[string]int{
			"localhost:" + port:        http.StatusOK,
			"127.0.0.1:" + port:        http.StatusOK,
			"ortbus.test:" + port:      http.StatusOK,
			"rebind.example:" + port:   http.StatusMisdirectedRequest,
			"127.0.0.1.nip.io:" + port: http.StatusMisdirectedRequest,
			"localhost:1":              http.StatusMisdirectedRequest,
		} {
			r := c.do(t, context.Background(), "GET", "/v1/health", "", withHost(host))
			if want != http.StatusOK {
				r.wantError(t, want, codec.CodeBadRequest)
			} else if r.status != want {
				t.Errorf("Host %s: %d %s, want %d", host, r.status, r.body, want)
			}
		}
		r := c.do(t, context.Background(), "POST", "/v1/tag", tagBody, withHost("rebind.example:"+port))
		r.wantError(t, http.StatusMisdirectedRequest, codec.CodeBadRequest)
	})

	t.Run("Token", func(t *testing.T) {
		for _, auth := range []string{"", "Bearer wrong", "Bearer not-this-one", "Basic " + token, token} {
			for _, path := range []string{"/v1/status", "/metrics", "/readyz"} {
				r := c.do(t, context.Background(), "GET", path, "", withAuth(auth))
				r.wantError(t, http.StatusUnauthorized, codec.CodeBadRequest)
				if r.header.Get("WWW-Authenticate") == "" {
					t.Errorf("401 on %s without WWW-Authenticate", path)
				}
			}
			r := c.do(t, context.Background(), "POST", "/v1/tag", tagBody, withAuth(auth))
			r.wantError(t, http.StatusUnauthorized, codec.CodeBadRequest)
		}
		if r := c.do(t, context.Background(), "GET", "/healthz", "", withAuth("")); r.status != http.StatusOK {
			t.Errorf("/healthz without a token: %d %s, want 200", r.status, r.body)
		}
		for _, path := range []string{"/v1/status", "/metrics", "/readyz"} {
			if r := c.do(t, context.Background(), "GET", path, ""); r.status != http.StatusOK {
				t.Errorf("%s with the token: %d %s", path, r.status, r.body)
			}
		}
	})

	t.Run("BodyLimit", func(t *testing.T) {
		big := fmt.Sprintf(`{"path":%s,"model":%q,"pad":%q}`, strconv.Quote(red), gwTagger, strings.Repeat("x", httpMaxBody))
		r := c.do(t, context.Background(), "POST", "/v1/tag", big)
		e := r.wantError(t, http.StatusRequestEntityTooLarge, codec.CodeBadRequest)
		if e != nil && !strings.Contains(e.Message, strconv.Itoa(httpMaxBody)) {
			t.Errorf("413 message %q does not name the limit %d", e.Message, httpMaxBody)
		}
		if r := c.do(t, context.Background(), "POST", "/v1/tag", tagBody); r.status != http.StatusOK {
			t.Errorf("a small body after a large one: %d %s", r.status, r.body)
		}
	})

	t.Run("Errors", func(t *testing.T) {
		c.do(t, context.Background(), "POST", "/v1/nosuch", `{}`).wantError(t, http.StatusNotFound, codec.CodeUnknownOp)
		c.do(t, context.Background(), "GET", "/nowhere", "").wantError(t, http.StatusNotFound, codec.CodeUnknownOp)
		c.do(t, context.Background(), "GET", "/v1/tag", "").wantError(t, http.StatusMethodNotAllowed, codec.CodeBadRequest)
		c.do(t, context.Background(), "POST", "/v1/tag", `{"path":`).wantError(t, http.StatusBadRequest, codec.CodeBadRequest)
		c.do(t, context.Background(), "POST", "/v1/tag", `{"path":"/not/in/root.png"}`).wantError(t, http.StatusForbidden, codec.CodeForbiddenPath)
	})

	// The worker's one slot busy with n slow interactive requests over NATS: a batch
	// request sent after them waits in the gateway (strict priority) until they are done
	// or cancelled. release cancels them and waits for their answers.
	busy := func(t *testing.T, n int) (release func()) {
		t.Helper()
		in := newInbox(t, g.NC)
		var ids []string
		for i := range n {
			id := fmt.Sprintf("%s-busy-%02d", t.Name(), i)
			ids = append(ids, id)
			g.post(t, in, "tag", id, &codec.Request{ID: id, Path: red, Class: "interactive", Model: gwSlow})
		}
		g.waitStatus(t, "the busy requests accepted", func(st *codec.StatusReply) bool {
			cl := classStatus(st, "interactive")
			return cl.Queued+cl.Running >= n/2
		})
		return func() {
			for _, id := range ids {
				opsCancel(t, g, id)
			}
			gwCollect(t, in, n)
		}
	}
	batchQueued := func(n int) func(*codec.StatusReply) bool {
		return func(st *codec.StatusReply) bool { return classStatus(st, "batch").Queued == n }
	}
	slowBody := func(id string) string {
		b := fmt.Sprintf(`{"path":%s,"model":%q,"class":"batch"`, strconv.Quote(red), gwSlow)
		if id != "" {
			b += fmt.Sprintf(`,"id":%q`, id)
		}
		return b + "}"
	}

	t.Run("Concurrency", func(t *testing.T) {
		release := busy(t, 20)
		held := make(chan httpResp, 1)
		go func() { held <- c.send(context.Background(), "POST", "/v1/tag", slowBody("http-held")) }()
		g.waitStatus(t, "the HTTP request queued", batchQueued(1))
		// http_max_concurrent = 1: the held request has the one place.
		r := c.do(t, context.Background(), "GET", "/v1/health", "")
		r.wantError(t, http.StatusTooManyRequests, codec.CodeOverloaded)
		c.do(t, context.Background(), "POST", "/v1/tag", tagBody).wantError(t, http.StatusTooManyRequests, codec.CodeOverloaded)
		for _, path := range []string{"/healthz", "/metrics"} {
			if r := c.do(t, context.Background(), "GET", path, ""); r.status != http.StatusOK {
				t.Errorf("%s while the API is at its bound: %d, want 200 (not bounded)", path, r.status)
			}
		}
		// Cancelled by an operator, the held request answers its HTTP client cancelled.
		if !opsCancel(t, g, "http-held") {
			t.Error("the operators' cancel did not find the held HTTP request")
		}
		select {
		case r := <-held:
			if r.err != nil {
				t.Fatalf("held request: %v", r.err)
			}
			r.wantError(t, 499, codec.CodeCancelled)
		case <-time.After(gwReplyBound):
			t.Fatalf("the held HTTP request was not answered within %v of its cancel", gwReplyBound)
		}
		release()
		if r := c.do(t, context.Background(), "GET", "/v1/health", ""); r.status != http.StatusOK {
			t.Errorf("after the held request: %d %s, want 200", r.status, r.body)
		}
	})

	t.Run("ClientGone", func(t *testing.T) {
		release := busy(t, 20)
		defer release()
		key := gwMetricKey("tag", "batch", "", gwSlow, string(codec.CodeCancelled))
		before := c.counts(t)[key]
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan httpResp, 1)
		// No id: the gateway gives it one, and cancels it by that id.
		go func() { done <- c.send(ctx, "POST", "/v1/tag", slowBody("")) }()
		g.waitStatus(t, "the HTTP request queued", batchQueued(1))
		cancel()
		if r := <-done; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("request with a cancelled context: %d %v", r.status, r.err)
		}
		g.waitStatus(t, "the abandoned request gone from the queue", batchQueued(0))
		checkFor(t, fmt.Sprintf("ortbus_requests_total{%s} to go from %v to %v", key, before, before+1), gwReplyBound, pollEvery, func() error {
			if n := c.counts(t)[key]; n != before+1 {
				return fmt.Errorf("it is %v", n)
			}
			return nil
		})
		// The gateway still answers (no write to a finished response broke anything).
		if r := c.do(t, context.Background(), "GET", "/v1/health", ""); r.status != http.StatusOK {
			t.Errorf("after an abandoned request: %d %s", r.status, r.body)
		}
	})

	if l := g.log(); strings.Contains(l, "panic recovered") || strings.Contains(l, "http: panic") {
		t.Errorf("the gateway logged a panic:\n%s", l)
	}
}

// opsCancel cancels request id through the operators' cancel (honoured for any request,
// whoever sent it) and reports whether the gateway found it.
func opsCancel(t testing.TB, g *gatewayProc, id string) bool {
	t.Helper()
	b, err := codec.Marshal(&codec.Cancel{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	m, err := g.NC.Request(subjects.OpsCancel, b, gwReplyBound)
	if err != nil {
		t.Fatalf("cancel %s: %v", id, err)
	}
	r := gwDecode(t, m)
	if r.Err != nil {
		t.Fatalf("cancel %s: %s: %s", id, r.Err.Code, r.Err.Message)
	}
	var cr codec.CancelReply
	if err := codec.Unmarshal(m.Data, &cr); err != nil {
		t.Fatalf("cancel reply: %v", err)
	}
	return cr.Found
}

// classStatus is the status of class name.
func classStatus(st *codec.StatusReply, name string) codec.ClassStatus {
	for _, c := range st.Classes {
		if c.Name == name {
			return c
		}
	}
	return codec.ClassStatus{}
}

func httpSum(counts map[string]float64, prefix string) float64 {
	var n float64
	for k, v := range counts {
		if strings.HasPrefix(k, prefix) {
			n += v
		}
	}
	return n
}

// httpClient calls a gateway's HTTP API with its bearer token.
type httpClient struct {
	addr, token string
}

// httpResp is one HTTP answer (or the error of the call).
type httpResp struct {
	status int
	header http.Header
	body   []byte
	err    error
}

type httpOpt func(*http.Request)

func withType(ct string) httpOpt { return func(r *http.Request) { r.Header.Set("Content-Type", ct) } }
func withHost(h string) httpOpt  { return func(r *http.Request) { r.Host = h } }
func withAuth(a string) httpOpt {
	return func(r *http.Request) {
		r.Header.Del("Authorization")
		if a != "" {
			r.Header.Set("Authorization", a)
		}
	}
}

// send makes one call: a POST is application/json with the token unless opts say
// otherwise. It does not fail t (it may run on another goroutine).
func (c *httpClient) send(ctx context.Context, method, path, body string, opts ...httpOpt) httpResp {
	ctx, cancel := context.WithTimeout(ctx, gwReplyBound)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.addr+path, rd)
	if err != nil {
		return httpResp{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, o := range opts {
		o(req)
	}
	if req.Header.Get("Content-Type") == "" {
		req.Header.Del("Content-Type")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return httpResp{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return httpResp{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// do is send, failing t when the call itself fails.
func (c *httpClient) do(t testing.TB, ctx context.Context, method, path, body string, opts ...httpOpt) httpResp {
	t.Helper()
	r := c.send(ctx, method, path, body, opts...)
	if r.err != nil {
		t.Fatalf("%s %s: %v", method, path, r.err)
	}
	return r
}

// wantError checks that r is a JSON error {code, message} with status and code, and
// returns it.
func (r httpResp) wantError(t testing.TB, status int, code codec.Code) *codec.Error {
	t.Helper()
	if r.status != status {
		t.Errorf("status %d (%s), want %d", r.status, r.body, status)
		return nil
	}
	if ct := r.header.Get("Content-Type"); ct != codec.ContentTypeJSON {
		t.Errorf("error %d with Content-Type %q, want %s", status, ct, codec.ContentTypeJSON)
	}
	var e codec.Error
	if err := json.Unmarshal(r.body, &e); err != nil || e.Code != code || e.Message == "" {
		t.Errorf("error body %q (%v), want code %s and a message", r.body, err, code)
		return nil
	}
	return &e
}

// counts scrapes ortbus_requests_total (with the token), keyed as gwRequestCounts does.
func (c *httpClient) counts(t testing.TB) map[string]float64 {
	t.Helper()
	r := c.do(t, context.Background(), "GET", "/metrics", "")
	if r.status != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", r.status, r.body)
	}
	return gwParseRequestCounts(t, string(r.body))
}
