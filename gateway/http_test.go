package gateway

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

// testHTTPAPI is the HTTP handler of a gateway that is not started: enough for the
// guards, which answer before any request reaches the queues.
func testHTTPAPI(t *testing.T, gatewayTOML, listen string, bound net.Addr, token string) *httpAPI {
	t.Helper()
	c, err := config.Parse([]byte("[nats]\nembedded = true\n[gateway]\n"+gatewayTOML+"\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	g := &Gateway{cfg: c, log: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: &metrics{reg: prometheus.NewRegistry()}}
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
