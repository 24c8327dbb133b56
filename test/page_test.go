package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// pageStack is the gateway of TestPage: its HTTP address stays across its restart, its
// callers are the operator and two HTTP accounts, alice and bob.
type pageStack struct {
	dir, http       string
	cfg             gwConfig
	g               *gatewayProc
	op, alice, bob  *httpClient
	fastID, bulkID  string
	images          []string
	opJob, aliceJob string
	leaseHolder     string
	leaseBytes      int64
}

// pageTokens are the callers' tokens (written to files: the config names files).
var pageTokens = map[string]string{"operator": "op-token-1", "alice": "alice-token-1", "bob": "bob-token-1"}

// pageJobItems is the items of the operator's job: gwSlow's ~110 ms each on one core,
// so that the job runs for seconds, through several of the page's once-a-second updates.
const pageJobItems = 24

// runPage drives the gateway's page (gateway/page.go) in a real headless Chromium
// against a real gateway and its workers: one gateway for every step (each step builds
// on the one before), restarted once at the end. Every wait is on the page's DOM
// (WaitVisible, a polled condition) or on the API's answer, never a sleep.
func runPage(t *testing.T) {
	browser := startBrowser(t) // first: without Chromium nothing else starts
	s := startPageStack(t)
	tab := newTab(t, browser)
	// Each step builds on the one before: the first that fails ends the test.
	for _, step := range []struct {
		name string
		f    func(t *testing.T)
	}{
		{"pools and workers", func(t *testing.T) { s.poolsAndWorkers(t, tab) }},
		{"pause batch and its owner", func(t *testing.T) {
			inBrowser(t, tab, "pause batch", chromedp.Click(chromedp.CSS("#pause-batch")),
				chromedp.WaitVisible(chromedp.CSS(`tr.pause[data-class="batch"][data-owner="operator"]`)))
			s.waitPauses(t, "batch paused by the operator", codec.PauseReply{Class: "batch"})
		}},
		{"a job's progress bar moves to done", func(t *testing.T) { s.jobToDone(t, tab) }},
		{"a lease in its device's bar", func(t *testing.T) { s.leaseInBar(t, tab) }},
		{"an account's page shows only its own", func(t *testing.T) { s.accountsApart(t, browser) }},
		{"an account pauses its own batch", func(t *testing.T) { s.accountPause(t, browser) }},
		{"it reconnects after the gateway restarts", func(t *testing.T) { s.restart(t, tab) }},
	} {
		if !t.Run(step.name, step.f) {
			return
		}
	}
}

// poolsAndWorkers: the operator's page shows both pools, their workers ready, and each
// worker's memory in the device's bar.
func (s *pageStack) poolsAndWorkers(t *testing.T, tab context.Context) {
	inBrowser(t, tab, "the operator's page",
		chromedp.Navigate(s.pageURL("operator")),
		chromedp.WaitVisible(chromedp.CSS(`.pool[data-pool="fast"] tr.worker[data-key="`+s.fastID+`"]`)),
		chromedp.WaitVisible(chromedp.CSS(`.pool[data-pool="bulk"] tr.worker[data-key="`+s.bulkID+`"]`)),
		waitTrue(`document.querySelector('#who').textContent === 'as operator'`),
		waitTrue(`document.querySelector('#conn').textContent === 'live'`),
		waitTrue(`[...document.querySelectorAll('tr.worker td:nth-child(2)')].every(td => td.textContent === 'ready')`),
		waitTrue(`/worker `+s.fastID+` \(fast\) [0-9.]+ MiB/.test(document.querySelector('.device[data-device="cpu"] .legend').textContent)`),
	)
	if got := evalIn[string](t, tab, `location.hash`); got != "" {
		t.Errorf("the token stays in the address: %q", got)
	}
}

// leaseInBar: alice's lease is in the cpu device's bar on the operator's page, with its
// holder, class and bytes, and in the lease table.
func (s *pageStack) leaseInBar(t *testing.T, tab context.Context) {
	s.acquireLease(t)
	inBrowser(t, tab, "the lease in the cpu bar",
		waitTrue(fmt.Sprintf(`[...document.querySelectorAll('.device[data-device="cpu"] .bar .seg[data-kind="lease"]')].some(e => e.dataset.bytes === '%d' && e.title.includes(%q))`, s.leaseBytes, s.leaseHolder)),
		waitTrue(fmt.Sprintf(`document.querySelector('.device[data-device="cpu"] .legend').textContent.includes('lease %s · batch 64.0 MiB')`, s.leaseHolder)),
		chromedp.WaitVisible(chromedp.CSS(`tr.lease[data-holder="`+s.leaseHolder+`"]`)))
	screenshot(t, tab, "page.png")
}

// startPageStack writes the tokens, the images and the config, and starts the gateway.
func startPageStack(t *testing.T) *pageStack {
	t.Helper()
	s := &pageStack{dir: t.TempDir(), http: freeAddr(t), leaseHolder: "alice-llm", leaseBytes: 64 << 20}
	tokenFile := func(who string) string {
		p := filepath.Join(s.dir, who+".token")
		if err := os.WriteFile(p, []byte(pageTokens[who]), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	root := filepath.Join(s.dir, "images")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < pageJobItems; i++ {
		s.images = append(s.images, writePNG(t, root, "item-"+strconv.Itoa(i)+".png", 64, 48, onnxgen.Solid([3]uint8{uint8(i * 10), 90, 200})))
	}
	s.cfg = gwConfig{
		Root: root, StoreDir: filepath.Join(s.dir, "store"),
		Devices: map[string]config.Device{"cpu": {Capacity: 2 << 30, SafeFraction: 0.85}},
		Gateway: config.Gateway{HTTPTokenFile: tokenFile("operator"), HTTPAccounts: map[string]string{"alice": tokenFile("alice"), "bob": tokenFile("bob")}},
		Pools: []gwPool{
			{Name: "fast", Version: "1.30.0", Workers: 1, Slots: 1, Classes: []string{"interactive"}, Models: []string{gwTagger}},
			{Name: "bulk", Version: "1.24.3", Workers: 1, Slots: 1, Classes: []string{"batch"}, Models: []string{gwSlow}},
		},
		Classes: []gwClass{{Name: "interactive", Chain: []string{"fast"}}, {Name: "batch", Chain: []string{"bulk"}}},
	}
	s.op = &httpClient{addr: s.http, token: pageTokens["operator"]}
	s.alice = &httpClient{addr: s.http, token: pageTokens["alice"]}
	s.bob = &httpClient{addr: s.http, token: pageTokens["bob"]}
	s.start(t, "first")
	s.fastID = onlyKey(t, s.g.waitLive(t, "fast", 1))
	s.bulkID = onlyKey(t, s.g.waitLive(t, "bulk", 1))
	s.g.awaitJobStore(t)
	return s
}

// start starts the gateway on the stack's HTTP address, its config and log in dir/name;
// it is stopped when t ends (or before: restart).
func (s *pageStack) start(t *testing.T, name string) {
	t.Helper()
	cfgPath := s.cfg.writeIn(t, mkdir(t, filepath.Join(s.dir, name)))
	g := spawnGatewayAt(t, cfgPath, "127.0.0.1:0", s.http)
	t.Cleanup(func() {
		g.stop(t)
		if t.Failed() {
			t.Logf("gateway log (%s):\n%s", g.logPath, g.log())
		}
	})
	g.awaitReady(t)
	g.connect(t, t.Name())
	t.Cleanup(g.NC.Close)
	s.g = g
}

func mkdir(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func onlyKey(t *testing.T, m map[string]codec.WorkerStatus) string {
	t.Helper()
	for k := range m {
		return k
	}
	t.Fatal("no worker")
	return ""
}

// pageURL is the page's address with who's token (taken once by the page).
func (s *pageStack) pageURL(who string) string {
	return "http://" + s.http + "/#token=" + pageTokens[who]
}

// call posts body (JSON) to path as c, or GETs path without a body, and decodes the
// answer into out, failing t on any error.
func call(t *testing.T, c *httpClient, method, path string, body, out any) {
	t.Helper()
	b := ""
	if body != nil {
		j, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		b = string(j)
	}
	r := c.do(t, context.Background(), method, path, b)
	if r.status != 200 {
		t.Fatalf("%s %s: %d %s", method, path, r.status, r.body)
	}
	if out != nil {
		if err := json.Unmarshal(r.body, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, r.body)
		}
	}
}

// waitPauses waits until the operator's status lists exactly want (their ends aside).
func (s *pageStack) waitPauses(t *testing.T, what string, want ...codec.PauseReply) {
	t.Helper()
	checkFor(t, what, gwReplyBound, pollEvery, func() error {
		var st codec.StatusReply
		call(t, s.op, "GET", "/v1/status", nil, &st)
		var got []codec.PauseReply
		for _, p := range st.Pauses {
			got = append(got, codec.PauseReply{Class: p.Class, Device: p.Device, Owner: p.Owner})
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("pauses %+v, want %+v", got, want)
		}
		return nil
	})
}

// jobToDone submits the operator's job while batch is paused (the page's pause, the step
// before): the page shows it waiting at 0, and once "resume" is clicked its bar moves,
// through values between, to done.
func (s *pageStack) jobToDone(t *testing.T, tab context.Context) {
	var sub codec.JobSubmitReply
	call(t, s.op, "POST", "/v1/job/submit", &codec.JobSubmit{Op: "tag", Model: gwSlow, Class: "batch", Items: s.images}, &sub)
	s.opJob = sub.Job
	card := `document.querySelector('.job[data-job="` + sub.Job + `"]')`
	inBrowser(t, tab, "the job waiting at 0",
		waitTrue(fmt.Sprintf(`(c => c && c.dataset.state === 'running' && c.querySelector('.progress').dataset.settled === '0' && c.querySelector('.progress').dataset.total === '%d')(%s)`, pageJobItems, card)),
		// Every value the bar shows from now on is kept.
		chromedp.Evaluate[chromedp.Void](`window.seen = []; new MutationObserver(() => window.seen.push(+`+card+`.querySelector('.progress').dataset.settled)).observe(`+card+`.querySelector('.progress'), {attributes: true, attributeFilter: ['data-settled']}); undefined`),
		chromedp.Click(chromedp.CSS("#resume-batch")),
		chromedp.WaitNotPresent(chromedp.CSS(`tr.pause[data-class="batch"]`)),
	)
	s.waitPauses(t, "batch resumed")
	inBrowser(t, tab, "the job done",
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`.job[data-job="%s"][data-state="done"] .progress[data-settled="%d"]`, sub.Job, pageJobItems))),
		waitTrue(card+`.querySelector('.progress .done').style.width === '100%'`),
	)
	seen := evalIn[[]int](t, tab, `window.seen`)
	if !slices.ContainsFunc(seen, func(n int) bool { return n > 0 && n < pageJobItems }) {
		t.Errorf("the bar went to done without a value between 0 and %d: %v", pageJobItems, seen)
	}
	var st codec.JobStatus
	call(t, s.op, "POST", "/v1/job/status", &codec.JobRef{Job: sub.Job}, &st)
	if st.State != codec.JobDone || st.Done != pageJobItems {
		t.Errorf("the job's status: %+v", st)
	}
}

// acquireLease acquires alice's lease on cpu (over HTTP, as alice).
func (s *pageStack) acquireLease(t *testing.T) {
	var l codec.LeaseReply
	call(t, s.alice, "POST", "/v1/lease", &codec.LeaseRequest{Action: codec.LeaseAcquire, Device: "cpu", Bytes: s.leaseBytes, Class: "batch",
		Holder: s.leaseHolder, TTLMS: 10 * 60 * 1000}, &l)
	if l.Lease == "" || l.Bytes != s.leaseBytes {
		t.Fatalf("lease %+v", l)
	}
}

// accountsApart: alice's page shows her job (its failed item with its reason) and lease
// and not the operator's job; bob's shows neither hers nor the operator's, and her lease
// only as "others' leases".
func (s *pageStack) accountsApart(t *testing.T, browser context.Context) {
	// Alice's job: one image and one file that is no image (its item fails).
	broken := filepath.Join(filepath.Dir(s.images[0]), "broken.png")
	if err := os.WriteFile(broken, []byte("not a picture"), 0o644); err != nil {
		t.Fatal(err)
	}
	var sub codec.JobSubmitReply
	call(t, s.alice, "POST", "/v1/job/submit", &codec.JobSubmit{Op: "tag", Model: gwSlow, Class: "batch", Items: []string{s.images[0], broken}}, &sub)
	s.aliceJob = sub.Job
	alice := newTab(t, browser)
	card := `.job[data-job="` + sub.Job + `"]`
	inBrowser(t, alice, "alice's page, her job's failed item",
		chromedp.Navigate(s.pageURL("alice")),
		waitTrue(`document.querySelector('#who').textContent === 'as alice'`),
		chromedp.WaitVisible(chromedp.CSS(`tr.lease[data-holder="`+s.leaseHolder+`"]`)),
		chromedp.WaitVisible(chromedp.CSS(card+`[data-state="done"] .progress[data-settled="2"]`)),
		chromedp.Click(chromedp.CSS(card+` .job-failed`)),
		waitTrue(`[...document.querySelectorAll('`+card+` ul.failed-items li')].some(li => li.textContent.startsWith('`+broken+`: unsupported_image: '))`),
	)
	if n := evalIn[int](t, alice, `document.querySelectorAll('.job[data-job="`+s.opJob+`"]').length`); n != 0 {
		t.Errorf("alice's page shows the operator's job %s", s.opJob)
	}
	bob := newTab(t, browser)
	inBrowser(t, bob, "bob's page",
		chromedp.Navigate(s.pageURL("bob")),
		waitTrue(`document.querySelector('#who').textContent === 'as bob'`),
		chromedp.WaitVisible(chromedp.CSS(`.pool[data-pool="bulk"] tr.worker`)),
		waitTrue(`document.querySelector('#jobs-note').textContent === 'no jobs'`),
		waitTrue(fmt.Sprintf(`[...document.querySelectorAll('.device[data-device="cpu"] .bar .seg[data-kind="other"]')].some(e => e.dataset.bytes === '%d')`, s.leaseBytes)),
	)
	for what, expr := range map[string]string{
		"a job":               `document.querySelectorAll('.job').length`,
		"a lease":             `document.querySelectorAll('tr.lease').length`,
		"a lease in the bar":  `document.querySelectorAll('.bar .seg[data-kind="lease"]').length`,
		"alice's lease named": `document.body.textContent.includes('` + s.leaseHolder + `') ? 1 : 0`,
	} {
		if n := evalIn[int](t, bob, expr); n != 0 {
			t.Errorf("bob's page shows %s of another's (%s: %d)", what, expr, n)
		}
	}
	screenshot(t, bob, "page-bob.png")
}

// accountPause: on alice's page only background classes can be paused; her "pause
// batch" is hers in status, and her "resume" ends it.
func (s *pageStack) accountPause(t *testing.T, browser context.Context) {
	alice := newTab(t, browser)
	inBrowser(t, alice, "alice pauses batch",
		chromedp.Navigate(s.pageURL("alice")),
		chromedp.WaitVisible(chromedp.CSS("#pause-batch")),
		waitTrue(`document.querySelector('#pause-interactive').offsetParent === null`),
		chromedp.Click(chromedp.CSS("#pause-batch")),
		chromedp.WaitVisible(chromedp.CSS(`tr.pause[data-class="batch"][data-owner="alice"]`)),
	)
	s.waitPauses(t, "batch paused by alice", codec.PauseReply{Class: "batch", Owner: "account:alice"})
	inBrowser(t, alice, "alice resumes batch",
		chromedp.Click(chromedp.CSS("#resume-batch")),
		chromedp.WaitNotPresent(chromedp.CSS(`tr.pause[data-class="batch"]`)),
	)
	s.waitPauses(t, "alice's pause ended")
}

// restart stops the gateway and starts another on the same address: the open page says
// it lost the gateway, then shows the new one's data without a reload.
func (s *pageStack) restart(t *testing.T, tab context.Context) {
	old := evalIn[string](t, tab, `document.querySelector('#gateway').textContent`)
	s.g.stop(t)
	inBrowser(t, tab, "the page after the gateway stopped", waitTrue(`document.querySelector('#conn').textContent === 'reconnecting'`))
	s.start(t, "second")
	inBrowser(t, tab, "the page after the gateway restarted",
		waitTrue(`document.querySelector('#conn').textContent === 'live'`),
		waitTrue(fmt.Sprintf(`document.querySelector('#gateway').textContent !== %q`, old)),
		chromedp.WaitVisible(chromedp.CSS(`.pool[data-pool="bulk"] tr.worker`)),
	)
}
