package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

// writeToken writes a token file in dir and returns its path.
func writeToken(t *testing.T, dir, name, token string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestHTTPAccountsRead(t *testing.T) {
	dir := t.TempDir()
	op, err := httpTokenFrom(t, "operator-token")
	if err != nil {
		t.Fatal(err)
	}
	conf := func(accounts map[string]string) *config.Config {
		return &config.Config{Gateway: config.Gateway{HTTPAccounts: accounts}}
	}
	alice, bob := writeToken(t, dir, "alice", "alice-token"), writeToken(t, dir, "bob", "bob-token")
	got, err := httpAccounts(conf(map[string]string{"bob": bob, "alice": alice}), op)
	if err != nil || len(got) != 2 || got[0].name != "alice" || got[1].name != "bob" {
		t.Fatalf("two accounts: %+v, %v", got, err)
	}
	if got, err := httpAccounts(conf(nil), nil); got != nil || err != nil {
		t.Errorf("no accounts: %+v, %v", got, err)
	}
	for name, c := range map[string]struct {
		accounts map[string]string
		operator []byte
		want     string
	}{
		"no operator token": {map[string]string{"alice": alice}, nil, "needs the operator's token"},
		"missing file":      {map[string]string{"alice": filepath.Join(dir, "nope")}, op, "no such file"},
		"empty file":        {map[string]string{"alice": writeToken(t, dir, "empty", " ")}, op, "is empty"},
		"the operator's":    {map[string]string{"alice": writeToken(t, dir, "op", "operator-token")}, op, "is the operator's"},
		"shared":            {map[string]string{"alice": alice, "carol": writeToken(t, dir, "carol", "alice-token")}, op, "alice's too"},
	} {
		if _, err := httpAccounts(conf(c.accounts), c.operator); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
}

// TestHTTPCaller: the operator's token is the operator, an account's token its account,
// anything else nobody; without a token everyone is the operator.
func TestHTTPCaller(t *testing.T) {
	a := testHTTPAPI(t, "", "127.0.0.1:0", tcpAddr("127.0.0.1", 8080), "s3cret")
	alice, _ := httpTokenFrom(t, "alice-token")
	a.accounts = []httpAccount{{name: "alice", sum: alice}}
	for auth, want := range map[string]struct {
		account string
		ok      bool
	}{
		"Bearer s3cret":        {"", true},
		"bearer  s3cret ":      {"", true},
		"Bearer alice-token":   {"account:alice", true},
		"Bearer alice-token2":  {"", false},
		"Basic alice-token":    {"", false},
		"":                     {"", false},
		"Bearer ":              {"", false},
		"Bearer account:alice": {"", false},
	} {
		r := httptest.NewRequest("GET", "http://127.0.0.1:8080/v1/status", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		if acc, ok := a.caller(r); acc != want.account || ok != want.ok {
			t.Errorf("Authorization %q: %q %v, want %q %v", auth, acc, ok, want.account, want.ok)
		}
	}
	open := testHTTPAPI(t, "", "127.0.0.1:0", tcpAddr("127.0.0.1", 8080), "")
	if acc, ok := open.caller(httptest.NewRequest("GET", "/", nil)); acc != "" || !ok {
		t.Errorf("without a token: %q %v, want the operator", acc, ok)
	}
}

// TestHTTPCallerServed: an account's request is served as the account, the operator's
// as the operator, through the same API function.
func TestHTTPCallerServed(t *testing.T) {
	a := testHTTPAPI(t, "", "127.0.0.1:0", tcpAddr("127.0.0.1", 8080), "s3cret")
	alice, _ := httpTokenFrom(t, "alice-token")
	a.accounts = []httpAccount{{name: "alice", sum: alice}}
	var got []string
	a.svc.serve = func(_ context.Context, op string, _ []byte, _ bool, account string, reply Reply) {
		got = append(got, op+" "+account)
		reply([]byte(`{}`), nil)
	}
	for _, tok := range []string{"s3cret", "alice-token"} {
		r := httptest.NewRequest("POST", "http://127.0.0.1:8080/v1/pause", strings.NewReader(`{"class":"batch"}`))
		r.Header.Set("Authorization", "Bearer "+tok)
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		a.ServeHTTP(w, r)
		if w.Code != 200 {
			t.Fatalf("%s: %d %s", tok, w.Code, w.Body)
		}
	}
	if strings.Join(got, ",") != "pause ,pause account:alice" {
		t.Errorf("served %q, want the operator's then alice's", got)
	}
}

func TestHTTPCrossSite(t *testing.T) {
	for _, c := range []struct {
		origin, site string
		want         bool
	}{
		{"", "", false},
		{"http://127.0.0.1:8080", "", false},
		{"http://127.0.0.1:8080", "same-origin", false},
		{"", "none", false},
		{"HTTP://127.0.0.1:8080", "", false},
		{"http://evil.example", "", true},
		{"http://127.0.0.1:8081", "", true},
		{"null", "", true},
		{"file://", "", true},
		{"", "cross-site", true},
		{"", "same-site", true},
		{"http://127.0.0.1:8080", "cross-site", true},
	} {
		r := httptest.NewRequest("POST", "http://127.0.0.1:8080/v1/pause", nil)
		if c.origin != "" {
			r.Header.Set("Origin", c.origin)
		}
		if c.site != "" {
			r.Header.Set("Sec-Fetch-Site", c.site)
		}
		if got := crossSite(r); got != c.want {
			t.Errorf("Origin %q, Sec-Fetch-Site %q: cross-site %v, want %v", c.origin, c.site, got, c.want)
		}
	}
}

// TestHTTPCrossSiteRefused: another site's POST is 403 before anything is served, even
// with the right token and content type; its GET is served.
func TestHTTPCrossSiteRefused(t *testing.T) {
	a := testHTTPAPI(t, "", "127.0.0.1:0", tcpAddr("127.0.0.1", 8080), "")
	served := 0
	a.svc.serve = func(_ context.Context, _ string, _ []byte, _ bool, _ string, reply Reply) {
		served++
		reply([]byte(`{}`), nil)
	}
	r := httptest.NewRequest("POST", "http://127.0.0.1:8080/v1/pause", strings.NewReader(`{"class":"batch"}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Origin", "http://evil.example")
	w := httptest.NewRecorder()
	a.ServeHTTP(w, r)
	if w.Code != http.StatusForbidden || served != 0 {
		t.Fatalf("a cross-site POST: %d (served %d): %s", w.Code, served, w.Body)
	}
	checkJSONError(t, w, codec.CodeBadRequest)
	r = httptest.NewRequest("GET", "http://127.0.0.1:8080/v1/status", nil)
	r.Header.Set("Origin", "http://evil.example")
	w = httptest.NewRecorder()
	a.ServeHTTP(w, r)
	if w.Code != 200 || served != 1 {
		t.Fatalf("a cross-site GET: %d (served %d): %s", w.Code, served, w.Body)
	}
}
