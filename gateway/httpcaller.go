package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/ortbus/ortbus/config"
)

// Who calls the HTTP API, and from where. The rules:
//
//  1. Without a token (gateway.http_token_file, ORTBUS_HTTP_TOKEN) every caller is the
//     local owner, the operator (account.go, rule 4): the API is loopback-bound.
//  2. With one, a request bearing it is the operator's; a request bearing the token of an
//     HTTP account (gateway.http_accounts NAME = file) is the account "account:NAME"'s,
//     with the rules of any account (account.go, rule 5): it sees and acts on its own
//     jobs, leases, pauses and cache entries only. Any other request is 401. Accounts
//     need the operator's token: without it a request with no token at all would be the
//     operator's.
//  3. A state-changing request (any method but GET and HEAD) that a browser sent from
//     another site is refused 403 (crossSite), beside the JSON content type every POST
//     needs (415 for a form's or text/plain's): no other site's page can run work, pause
//     a class or cancel a job through a browser that can reach the gateway.

// httpAccount is one HTTP account: its name and its token's SHA-256.
type httpAccount struct {
	name string
	sum  []byte
}

// httpAccounts reads the tokens of c's HTTP accounts (rule 2); operator is the operator's
// token's hash. Each file must exist, not be empty, and hold a token no other caller has.
func httpAccounts(c *config.Config, operator []byte) ([]httpAccount, error) {
	names := make([]string, 0, len(c.Gateway.HTTPAccounts))
	for name := range c.Gateway.HTTPAccounts {
		names = append(names, name)
	}
	if len(names) == 0 {
		return nil, nil
	}
	if operator == nil {
		return nil, fmt.Errorf("gateway.http_accounts needs the operator's token too (gateway.http_token_file or %s): without it a request without a token is the operator's", config.HTTPTokenEnv)
	}
	slices.Sort(names)
	var out []httpAccount
	for _, name := range names {
		sum, err := httpTokenFile(c.Gateway.HTTPAccounts[name])
		if err != nil {
			return nil, fmt.Errorf("gateway.http_accounts %s: %w", name, err)
		}
		if bytes.Equal(sum, operator) {
			return nil, fmt.Errorf("gateway.http_accounts %s: its token is the operator's", name)
		}
		for _, o := range out {
			if bytes.Equal(o.sum, sum) {
				return nil, fmt.Errorf("gateway.http_accounts %s: its token is %s's too", name, o.name)
			}
		}
		out = append(out, httpAccount{name: name, sum: sum})
	}
	return out, nil
}

// callerKey keys a request's account ("" the operator) in its context.
type callerKey struct{}

// withCaller is r with its caller's account in its context.
func withCaller(r *http.Request, account string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), callerKey{}, account))
}

// callerOf is the account of the request whose context is ctx ("" the operator).
func callerOf(ctx context.Context) string {
	s, _ := ctx.Value(callerKey{}).(string)
	return s
}

// caller is who sent r (rule 2): its account ("" the operator), ok false when it bears
// no token that is known.
func (a *httpAPI) caller(r *http.Request) (account string, ok bool) {
	if a.token == nil {
		return "", true
	}
	scheme, cred, found := strings.Cut(r.Header.Get("Authorization"), " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(cred)))
	if subtle.ConstantTimeCompare(sum[:], a.token) == 1 {
		return "", true
	}
	for _, acc := range a.accounts {
		if subtle.ConstantTimeCompare(sum[:], acc.sum) == 1 {
			return accountPrefix + acc.name, true
		}
	}
	return "", false
}

// accountPrefix starts every account's name as the gateway knows it (accountOf).
const accountPrefix = "account:"

// crossSite reports whether r is a browser's request sent by a page of another site
// (rule 3): Sec-Fetch-Site says so, or its Origin (which browsers send on every POST)
// names another host than the request's Host. A request without either header did not
// come from another site's page (curl, the CLI, a server).
func crossSite(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return true
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return false
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return true // "null" (a sandboxed frame, a file) or garbage
	}
	return !strings.EqualFold(u.Host, r.Host)
}

// safeMethod reports whether method changes nothing (rule 3 leaves it).
func safeMethod(method string) bool { return method == http.MethodGet || method == http.MethodHead }
