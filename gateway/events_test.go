package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// eventsAPI is an HTTP API whose ops are answered by a fake: status names the caller, the
// job list is jobs (or jobsErr); calls counts the ops served.
func eventsAPI(t *testing.T, token string, jobsErr *codec.Error) (*httpAPI, *atomic.Int64) {
	t.Helper()
	return eventsAPIOn(t, tcpAddr("127.0.0.1", 8080), token, jobsErr)
}

// eventsAPIOn is eventsAPI bound at bound.
func eventsAPIOn(t *testing.T, bound net.Addr, token string, jobsErr *codec.Error) (*httpAPI, *atomic.Int64) {
	t.Helper()
	a := testHTTPAPI(t, "", "127.0.0.1:0", bound, token)
	calls := &atomic.Int64{}
	a.svc.serve = func(_ context.Context, op string, _ []byte, _ bool, account string, reply Reply) {
		calls.Add(1)
		switch op {
		case subjects.OpStatus:
			b, _ := json.Marshal(&codec.StatusReply{Gateway: "gw-of-" + account})
			reply(b, nil)
		case subjects.OpJobList:
			if jobsErr != nil {
				reply(nil, jobsErr)
				return
			}
			b, _ := json.Marshal(&codec.JobListReply{Jobs: []codec.JobStatus{{Job: "job-of-" + account, State: codec.JobRunning}}})
			reply(b, nil)
		default:
			t.Errorf("op %s asked", op)
		}
	}
	a.events.history = func() map[string][]float64 { return map[string][]float64{"batch": {1.5, math.NaN(), 2}} }
	return a, calls
}

// TestEventsSnapshot: a snapshot is the caller's status and job list, and the p95
// history with its gaps as null.
func TestEventsSnapshot(t *testing.T) {
	a, _ := eventsAPI(t, "", nil)
	w := httptest.NewRecorder()
	a.ServeHTTP(w, httptest.NewRequest("GET", "http://127.0.0.1:8080/v1/snapshot", nil))
	if w.Code != 200 || w.Header().Get("Content-Type") != codec.ContentTypeJSON {
		t.Fatalf("%d %q: %s", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
	var snap struct {
		Account string                `json:"account"`
		Status  codec.StatusReply     `json:"status"`
		Jobs    codec.JobListReply    `json:"jobs"`
		History map[string][]*float64 `json:"p95_history"`
		Step    int64                 `json:"p95_history_step_ms"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &snap); err != nil {
		t.Fatal(err)
	}
	h := snap.History["batch"]
	if snap.Account != "" || snap.Status.Gateway != "gw-of-" || len(snap.Jobs.Jobs) != 1 || snap.Jobs.Jobs[0].Job != "job-of-" ||
		len(h) != 3 || h[1] != nil || h[0] == nil || snap.Step != 5000 {
		t.Errorf("snapshot %s", w.Body)
	}
	// Without a job store: its error, and the status all the same.
	a, _ = eventsAPI(t, "", codec.Errorf(codec.CodeUnavailable, "no job store"))
	w = httptest.NewRecorder()
	a.ServeHTTP(w, httptest.NewRequest("GET", "http://127.0.0.1:8080/v1/snapshot", nil))
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"jobs_error":{"code":"unavailable"`) || strings.Contains(w.Body.String(), `"jobs":`) {
		t.Errorf("without a job store: %d %s", w.Code, w.Body)
	}
}

// TestEventsSnapshotAccount: an account's snapshot is made by the API as that account's;
// without the token, 401.
func TestEventsSnapshotAccount(t *testing.T) {
	a, _ := eventsAPI(t, "s3cret", nil)
	alice, _ := httpTokenFrom(t, "alice-token")
	a.accounts = []httpAccount{{name: "alice", sum: alice}}
	for auth, want := range map[string]string{"Bearer alice-token": `"gateway":"gw-of-account:alice"`, "Bearer s3cret": `"gateway":"gw-of-"`} {
		r := httptest.NewRequest("GET", "http://127.0.0.1:8080/v1/snapshot", nil)
		r.Header.Set("Authorization", auth)
		w := httptest.NewRecorder()
		a.ServeHTTP(w, r)
		if w.Code != 200 || !strings.Contains(w.Body.String(), want) {
			t.Errorf("%s: %d %s, want %s", auth, w.Code, w.Body, want)
		}
	}
	for _, path := range []string{"/v1/snapshot", "/v1/events"} {
		w := httptest.NewRecorder()
		a.ServeHTTP(w, httptest.NewRequest("GET", "http://127.0.0.1:8080"+path, nil))
		if w.Code != 401 {
			t.Errorf("%s without a token: %d", path, w.Code)
		}
	}
}

// TestEventsShared: snapshots of one caller within snapshotReuse are one.
func TestEventsShared(t *testing.T) {
	a, calls := eventsAPI(t, "", nil)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, e := a.events.snapshot(""); e != nil {
				t.Error(e)
			}
		}()
	}
	wg.Wait()
	if n := calls.Load(); n != 2 {
		t.Errorf("8 snapshots at once made %d calls, want 2 (one status, one job list)", n)
	}
}

// TestEventsStream: a real server's stream says retry first, then a snapshot event of one
// line, again each second; the server's shutdown ends it.
func TestEventsStream(t *testing.T) {
	ln := listenLoopback(t)
	a, _ := eventsAPIOn(t, ln.Addr(), "", nil)
	srv := startHTTP(a.cfg, a.log, ln, a)
	srv.RegisterOnShutdown(a.events.close)
	defer srv.Close()
	resp, err := http.Get("http://" + ln.Addr().String() + "/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream; charset=utf-8" || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("%d %v", resp.StatusCode, resp.Header)
	}
	rd := bufio.NewReader(resp.Body)
	line := func() string {
		s, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the stream: %v", err)
		}
		return strings.TrimSuffix(s, "\n")
	}
	if l, blank := line(), line(); l != "retry: 1000" || blank != "" {
		t.Fatalf("first %q %q, want retry: 1000 and a blank line", l, blank)
	}
	for i := 0; i < 2; i++ {
		ev, data, blank := line(), line(), line()
		if ev != "event: snapshot" || !strings.HasPrefix(data, `data: {"now_unix_ms":`) || blank != "" {
			t.Fatalf("event %d: %q %q %q", i, ev, data, blank)
		}
	}
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(context.Background()) }()
	for {
		if _, err := rd.ReadString('\n'); err != nil {
			break // the stream ended
		}
	}
	if err := <-done; err != nil {
		t.Errorf("shutdown with a stream open: %v", err)
	}
}

// TestEventsStreamBound: past the bound of streams, 429 overloaded.
func TestEventsStreamBound(t *testing.T) {
	a, _ := eventsAPI(t, "", nil)
	for i := 0; i < cap(a.events.slots); i++ {
		a.events.slots <- struct{}{}
	}
	w := httptest.NewRecorder()
	a.ServeHTTP(w, httptest.NewRequest("GET", "http://127.0.0.1:8080/v1/events", nil))
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	checkJSONError(t, w, codec.CodeOverloaded)
	if cap(a.events.slots) != httpMaxConns(a.cfg)/4 {
		t.Errorf("bound %d, want a quarter of the connections (%d)", cap(a.events.slots), httpMaxConns(a.cfg))
	}
}
