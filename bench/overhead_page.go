package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// overhead -pages N: the cost of the gateway's page (gateway/page.go) on the gateway path.
// A second system, as the first but with its HTTP API on, has N pages open on it: each
// page is opened as a browser opens it (GET /, GET /v1/snapshot) and then reads its event
// stream, GET /v1/events, a snapshot a second (the caller's status and job list, made for
// it by the gateway), in the bench process as the page's worker reads it. That system's
// gateway path is timed in the same interleaved blocks as the first system's, which
// serves no page. Then, with no calls at all, both gateway processes' CPU time over
// pageIdleWindow: what the open pages cost the page system's gateway by themselves, beside
// the plain one's idle cost (the plain gateway's CPU over the blocks would not compare: its
// embedded NATS server also carries the raw and echo paths).

// PageOverhead is the page system's gateway path of overhead -pages.
type PageOverhead struct {
	// Pages is how many pages were open, each reading its stream.
	Pages   int       `json:"pages"`
	Gateway LatencyUS `json:"gateway"`
	// MinusPlainP50US is its p50 less the plain gateway path's, in microseconds.
	MinusPlainP50US float64 `json:"minus_plain_p50_us"`
	// Events and EventBytes are the snapshot events the pages read over the timed
	// blocks (WallS long, warm-up included), and their bytes.
	Events     int64   `json:"events"`
	EventBytes int64   `json:"event_bytes"`
	WallS      float64 `json:"wall_s"`
	// IdleS is the window after the blocks, without calls, over which IdleEvents were
	// read and the gateways' CPU time (user + system, /proc, at clock-tick resolution:
	// 10 ms) was taken: IdleCPUMSPerS of the page system's gateway, PlainIdleCPUMSPerS of
	// the plain system's, in ms of CPU per second.
	IdleS              float64 `json:"idle_s"`
	IdleEvents         int64   `json:"idle_events"`
	IdleCPUMSPerS      float64 `json:"idle_cpu_ms_per_s"`
	PlainIdleCPUMSPerS float64 `json:"plain_idle_cpu_ms_per_s"`
}

// pageIdleWindow is the window of the idle CPU figures: long against the 10 ms ticks and
// the stream's one event a second.
const pageIdleWindow = 10 * time.Second

// pageReaders are the open pages of the page system: what their streams read.
type pageReaders struct {
	events atomic.Int64
	bytes  atomic.Int64
	stop   context.CancelFunc
	wg     sync.WaitGroup
	errMu  sync.Mutex
	err    error // the first stream that ended before stop
}

// pageOpenBound bounds a page's opening (its page and its first snapshot).
const pageOpenBound = 10 * time.Second

// pageRun is the page system's part of one overhead run: its pages, its system and the
// plain one, and their figures at the start of the timed blocks.
type pageRun struct {
	n          int
	pr         *pageReaders
	sys, plain *system
	t0         time.Time
	ev0, evb0  int64
}

// pagePath starts the page system of overhead (cfg as the plain system's, plain) with n
// pages open, and returns its gateway path (one call of req), the run, and their stop.
func pagePath(ctx context.Context, h *harness, cfg sysConfig, req codec.Request, n int, plain *system) (func() error, *pageRun, func(), error) {
	path, err := h.w.writeConfig(h.o, "overhead-page", cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	sys, err := startSystemHTTP(ctx, h.o, h.w, "overhead-page", path, nil, "127.0.0.1:0", nil)
	if err != nil {
		return nil, nil, nil, err
	}
	pr, err := openPages(ctx, "http://"+sys.ready.HTTP, n)
	if err != nil {
		sys.stop()
		return nil, nil, nil, err
	}
	call := func() error {
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := sys.cl.Infer(c, req)
		return err
	}
	return call, &pageRun{n: n, pr: pr, sys: sys, plain: plain}, func() { pr.close(); sys.stop() }, nil
}

// begin takes the figures at the start of the timed blocks (nothing for no run).
func (r *pageRun) begin() {
	if r == nil {
		return
	}
	r.t0 = time.Now()
	r.ev0, r.evb0 = r.pr.events.Load(), r.pr.bytes.Load()
}

// result is the run's figures at the end of the timed blocks, then over the idle window
// (ctx ends it early: an error): paged is the page system's gateway path, plainGW the
// plain system's (nil, nil for no run; an error when a page's stream ended meanwhile).
func (r *pageRun) result(ctx context.Context, paged, plainGW Summary, idle time.Duration) (*PageOverhead, error) {
	if r == nil {
		return nil, nil
	}
	res := &PageOverhead{Pages: r.n, Gateway: latencyUS(paged), MinusPlainP50US: round(us(paged.P50)-us(plainGW.P50), 1),
		Events: r.pr.events.Load() - r.ev0, EventBytes: r.pr.bytes.Load() - r.evb0, WallS: round(time.Since(r.t0).Seconds(), 2)}
	t0, ev0 := time.Now(), r.pr.events.Load()
	cpu0 := [2]float64{r.sys.gatewayCPU(), r.plain.gatewayCPU()}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(idle): // the measuring window itself
	}
	cpu1, wall := [2]float64{r.sys.gatewayCPU(), r.plain.gatewayCPU()}, time.Since(t0).Seconds()
	res.IdleS, res.IdleEvents = round(wall, 2), r.pr.events.Load()-ev0
	res.IdleCPUMSPerS, res.PlainIdleCPUMSPerS = round((cpu1[0]-cpu0[0])/wall, 2), round((cpu1[1]-cpu0[1])/wall, 2)
	if err := r.pr.failed(); err != nil {
		return nil, err
	}
	return res, nil
}

// openPages opens n pages on the gateway at base: each fetches the page and a snapshot,
// then reads its stream until close. It returns once every stream has sent its first
// snapshot.
func openPages(ctx context.Context, base string, n int) (*pageReaders, error) {
	sctx, stop := context.WithCancel(ctx)
	pr := &pageReaders{stop: stop}
	first := make(chan error, n)
	for i := 0; i < n; i++ {
		pr.wg.Add(1)
		go func() {
			defer pr.wg.Done()
			pr.read(sctx, base, first)
		}()
	}
	timeout := time.After(pageOpenBound)
	for i := 0; i < n; i++ {
		select {
		case err := <-first:
			if err != nil {
				pr.close()
				return nil, err
			}
		case <-timeout:
			pr.close()
			return nil, fmt.Errorf("pages: not every stream sent a snapshot within %v", pageOpenBound)
		}
	}
	return pr, nil
}

// read is one page: it opens the page as a browser does, then reads its stream, telling
// first of its first snapshot (or of its failure).
func (pr *pageReaders) read(ctx context.Context, base string, first chan<- error) {
	told := false
	tell := func(err error) { // at most once; first has room for every page
		if !told {
			told = true
			first <- err
		}
	}
	for _, p := range []string{"/", "/v1/snapshot"} {
		if err := pageGet(ctx, base+p); err != nil {
			tell(err)
			return
		}
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tell(err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tell(fmt.Errorf("GET /v1/events: %s", resp.Status))
		return
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	seen := false
	for sc.Scan() {
		line := sc.Bytes()
		if bytes.HasPrefix(line, []byte("data: ")) {
			pr.events.Add(1)
			pr.bytes.Add(int64(len(line)))
			if !seen {
				seen = true
				tell(nil)
			}
		}
	}
	if ctx.Err() == nil {
		pr.errMu.Lock()
		if pr.err == nil {
			pr.err = fmt.Errorf("a page's stream ended: %v", sc.Err())
		}
		pr.errMu.Unlock()
		tell(pr.err)
	}
}

// pageGet fetches url and reads its body, failing on any status but 200.
func pageGet(ctx context.Context, url string) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// close closes the pages and waits for their readers.
func (pr *pageReaders) close() {
	pr.stop()
	pr.wg.Wait()
}

// failed is why a page's stream ended before close, nil when none did.
func (pr *pageReaders) failed() error {
	pr.errMu.Lock()
	defer pr.errMu.Unlock()
	return pr.err
}

// gatewayCPU is the CPU time (user + system) the system's gateway process has used, in ms.
func (s *system) gatewayCPU() float64 {
	return float64(cpuTicks([]int{s.gw.PID()})) * 1000 / clockTicks
}

// clockTicks is /proc's clock ticks per second (USER_HZ, 100 on Linux).
const clockTicks = 100
