package bench

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// TestOpenPages: each page fetches the page and a snapshot, then reads its stream,
// counting the events; openPages returns once every stream sent one; a stream that ends
// before close is the run's error.
func TestOpenPages(t *testing.T) {
	end := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/events" {
			fmt.Fprint(w, "{}")
			return
		}
		fmt.Fprint(w, "retry: 1000\n\n")
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "event: snapshot\ndata: {\"n\":%d}\n\n", i)
		}
		w.(http.Flusher).Flush()
		select {
		case <-end:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	pr, err := openPages(context.Background(), srv.URL, 2)
	if err != nil {
		t.Fatal(err)
	}
	ev, b := pr.events.Load(), pr.bytes.Load()
	if ev < 2 || b < 2*int64(len(`data: {"n":0}`)) {
		t.Errorf("%d events, %d bytes after the first of each stream", ev, b)
	}
	close(end) // the streams end before close: a failure of the run
	pr.wg.Wait()
	if err := pr.failed(); err == nil || !strings.Contains(err.Error(), "stream ended") {
		t.Errorf("a stream that ended: %v", err)
	}
	pr.close()

	gone := httptest.NewServer(http.NotFoundHandler())
	defer gone.Close()
	if _, err := openPages(context.Background(), gone.URL, 1); err == nil {
		t.Error("pages opened on a server without the page")
	}
}

// TestOverheadPagesSmall runs overhead -pages with a few calls: the page system's path is
// timed beside the plain one, its pages read their streams, and both gateways' CPU is
// reported.
func TestOverheadPagesSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two gateways; skipped with -short")
	}
	root := testenv.RepoRoot(t)
	testenv.RuntimeLib(t, RuntimeVersion)
	bin := buildSystem(t, root)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var table bytes.Buffer
	const idle = 3 * time.Second
	rep, err := Overhead(ctx, Options{Repo: root, BinDir: bin, N: 300, Pages: 2, Out: &table, pageIdle: idle})
	t.Logf("overhead -pages 2:\n%s", table.String())
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Results.(*OverheadResults)
	pg := res.Page
	// The idle window reads the pages' events: 2 pages, one event a second each.
	if pg == nil || pg.Pages != 2 || pg.Gateway.P50 <= 0 || res.Gateway.P50 <= 0 || pg.WallS <= 0 || pg.IdleS < idle.Seconds() ||
		pg.IdleEvents < 2*int64(idle/time.Second)-2 || pg.IdleCPUMSPerS < 0 || pg.PlainIdleCPUMSPerS < 0 {
		t.Fatalf("page %+v, plain %+v", pg, res.Gateway)
	}
	if !strings.Contains(table.String(), "gateway, 2 page(s) open (-pages)") || !strings.Contains(table.String(), "gateway CPU, idle") {
		t.Errorf("the table has no page rows")
	}
}
