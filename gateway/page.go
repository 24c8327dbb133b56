package gateway

import (
	"embed"
	"net/http"
	"path"
	"strings"

	"github.com/ortbus/ortbus/codec"
)

// The page: GET / on the HTTP API's listener is a page that shows the devices' memory, the
// pools and workers, the classes, leases, gates, pauses and jobs, live, and steers them
// (pause and resume a class, pause, resume and cancel a job). The rules:
//
//  1. Its files are embedded (go:embed page): the HTML, one style sheet, one script and
//     the script of the worker that reads the event stream. Nothing comes from anywhere
//     else: its Content-Security-Policy lets it load and connect only to this origin, run
//     no inline script, and be framed by nobody.
//  2. They hold no data, so they need no token (publicPath; the Host guard applies):
//     what the page shows it asks of the API with the caller's token — GET /v1/snapshot
//     first, then the stream GET /v1/events (events.go) — and what it does it asks of
//     the API too (POST /v1/pause, /v1/job/pause, ...), under the API's owner rules
//     and its guard against other sites' requests (httpcaller.go). With a token set, the
//     page asks for one (or takes it once from the address's #token=...) and keeps it in
//     the tab's sessionStorage.
//  3. The stream is read in a dedicated worker (stream.js), off the page's own loading:
//     a tool that waits for the page's network to go idle (headless Chromium's
//     --virtual-time-budget) is not held by a stream that never ends. It reconnects a
//     second after it is lost, for as long as the page is open.
//
//go:embed page
var pageFiles embed.FS

// pageTypes are the page's files by name, with their content types.
var pageTypes = map[string]string{
	"page.css":  "text/css; charset=utf-8",
	"page.js":   "text/javascript; charset=utf-8",
	"stream.js": "text/javascript; charset=utf-8",
}

// pageCSP is the page's Content-Security-Policy (rule 1).
const pageCSP = "default-src 'none'; script-src 'self'; worker-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; " +
	"form-action 'none'; base-uri 'none'; frame-ancestors 'none'"

// publicPath reports whether p is served without a token (rule 2): /healthz and the
// page's files.
func publicPath(p string) bool {
	return p == "/healthz" || p == "/" || strings.HasPrefix(p, "/page/")
}

// servePage answers GET /: the page's HTML.
func servePage(w http.ResponseWriter, _ *http.Request) {
	writePageFile(w, "index.html", "text/html; charset=utf-8")
}

// servePageFile answers GET /page/{file}: one of pageTypes, else 404.
func servePageFile(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("file")
	ct, ok := pageTypes[name]
	if !ok {
		httpError(w, http.StatusNotFound, codec.Errorf(codec.CodeUnknownOp, "no page file %q", truncate(name, 64)))
		return
	}
	writePageFile(w, name, ct)
}

// writePageFile writes the embedded file name with content type ct and the page's
// headers.
func writePageFile(w http.ResponseWriter, name, ct string) {
	b, err := pageFiles.ReadFile(path.Join("page", name))
	if err != nil {
		httpError(w, http.StatusInternalServerError, codec.Errorf(codec.CodeInternal, "page file %s: %v", name, err))
		return
	}
	h := w.Header()
	h.Set("Content-Type", ct)
	h.Set("Content-Security-Policy", pageCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
	w.Write(b)
}
