package gateway

import (
	"io/fs"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
)

// TestPageFiles: the page and its files need no token, carry the page's headers and
// their own content types; anything else under /page/ is 404; the API still needs the
// token.
func TestPageFiles(t *testing.T) {
	a := testHTTPAPI(t, "", "127.0.0.1:0", tcpAddr("127.0.0.1", 8080), "s3cret")
	for path, ct := range map[string]string{
		"/":               "text/html; charset=utf-8",
		"/page/page.js":   "text/javascript; charset=utf-8",
		"/page/stream.js": "text/javascript; charset=utf-8",
		"/page/page.css":  "text/css; charset=utf-8",
	} {
		w := httptest.NewRecorder()
		a.ServeHTTP(w, httptest.NewRequest("GET", "http://127.0.0.1:8080"+path, nil))
		h := w.Header()
		if w.Code != 200 || h.Get("Content-Type") != ct || h.Get("Content-Security-Policy") != pageCSP ||
			h.Get("X-Frame-Options") != "DENY" || h.Get("X-Content-Type-Options") != "nosniff" || w.Body.Len() == 0 {
			t.Errorf("GET %s: %d %v", path, w.Code, h)
		}
	}
	for path, status := range map[string]int{"/page/nope.js": 404, "/page/": 404, "/page/%2e%2e%2fgateway.go": 404, "/v1/status": 401, "/index.html": 401} {
		w := httptest.NewRecorder()
		a.ServeHTTP(w, httptest.NewRequest("GET", "http://127.0.0.1:8080"+path, nil))
		if w.Code != status {
			t.Errorf("GET %s: %d, want %d: %s", path, w.Code, status, w.Body)
		}
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "http://127.0.0.1:8080/page/nope.js", nil)
	r.Header.Set("Authorization", "Bearer s3cret")
	a.ServeHTTP(w, r)
	if w.Code != 404 {
		t.Fatalf("an unknown page file: %d", w.Code)
	}
	checkJSONError(t, w, codec.CodeUnknownOp)
	// Another method: 405 with what is allowed (a POST names an op: unknown_op).
	for _, path := range []string{"/", "/page/page.js", "/v1/events"} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("PUT", "http://127.0.0.1:8080"+path, nil)
		r.Header.Set("Authorization", "Bearer s3cret")
		a.ServeHTTP(w, r)
		if w.Code != 405 || w.Header().Get("Allow") != "GET, HEAD" {
			t.Errorf("PUT %s: %d, Allow %q", path, w.Code, w.Header().Get("Allow"))
		}
	}
	// The Host guard holds for the page too.
	w = httptest.NewRecorder()
	r = httptest.NewRequest("GET", "http://evil.example/", nil)
	a.ServeHTTP(w, r)
	if w.Code != 421 {
		t.Errorf("the page for another Host: %d", w.Code)
	}
}

// TestPageSelfContained: every file is embedded and named in pageTypes (or is the HTML),
// and nothing in them loads from another origin or runs inline.
func TestPageSelfContained(t *testing.T) {
	names, err := fs.Glob(pageFiles, "page/*")
	if err != nil {
		t.Fatal(err)
	}
	remote := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	for _, name := range names {
		base := strings.TrimPrefix(name, "page/")
		if _, ok := pageTypes[base]; !ok && base != "index.html" {
			t.Errorf("%s is embedded but not served", name)
		}
		b, _ := pageFiles.ReadFile(name)
		text := strings.ReplaceAll(string(b), "http://www.w3.org/2000/svg", "")
		if m := remote.FindString(text); m != "" {
			t.Errorf("%s names another origin: %s", name, m)
		}
		if strings.Contains(text, "innerHTML") || strings.Contains(text, "eval(") || strings.Contains(text, "style=\"") {
			t.Errorf("%s writes HTML from strings, evaluates code or styles inline", name)
		}
	}
	html, _ := pageFiles.ReadFile("page/index.html")
	if regexp.MustCompile(`<script>|<script [^>]*>[^<]`).Match(html) {
		t.Error("index.html has an inline script")
	}
}

func TestPublicPath(t *testing.T) {
	for p, want := range map[string]bool{"/": true, "/healthz": true, "/page/page.js": true, "/v1/status": false, "/metrics": false, "/readyz": false, "/pages": false} {
		if publicPath(p) != want {
			t.Errorf("%s: public %v, want %v", p, !want, want)
		}
	}
}
