// Package demo runs ortbus end to end on one machine from a config file: the gateway
// (with its embedded NATS server and its local pools' resident workers), demo images
// written under the spool directory, a round of real requests of every op through the
// client API, and a burst of batch tagging beside interactive requests, printed as a report.
// `make demo` runs it on deploy/local.toml.
package demo

import (
	"context"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/launch"
	"github.com/ortbus/ortbus/subjects"
)

// Bounds of the gateway's start (its workers load every model) and of its stop.
const (
	startBound = 2 * time.Minute
	stopBound  = 30 * time.Second
)

// Options for Run.
type Options struct {
	Config string
	// GatewayBin is the gateway executable (it finds ortworker next to itself).
	GatewayBin string
	Out        io.Writer
	// Stay, when set, keeps the gateway (and its page) running after the report until it
	// is closed (an interrupt, in `ortbus demo -stay`).
	Stay <-chan struct{}
}

// Run starts a gateway on the config (embedded NATS on a free loopback port, its local
// pools' workers), sends a round of real requests of every op through the client API,
// prints a report, stops the gateway, and returns an error if any request failed.
func Run(o Options) error {
	var tee io.Writer
	if os.Getenv("ORTBUS_DEMO_VERBOSE") != "" {
		tee = os.Stderr
	}
	gw, err := launch.Start(o.GatewayBin, []string{"-config", o.Config, "-nats-listen", "127.0.0.1:0", "-http-listen", "127.0.0.1:0"},
		launch.Options{Name: "the gateway", Tee: tee})
	if err != nil {
		return err
	}
	defer gw.Stop(stopBound)
	ready, err := gw.Ready(context.Background(), startBound)
	if err != nil {
		return fmt.Errorf("%w; its log ends:\n%s", err, gw.LogTail(20))
	}
	fmt.Fprintf(o.Out, "gateway     NATS %s, HTTP %s\n", ready.NATSURL, ready.HTTP)
	fmt.Fprintf(o.Out, "page        http://%s/   (devices, pools, classes, leases, jobs, live; %s)\n", ready.HTTP, stayNote(o.Stay != nil))
	c, err := client.Connect(ready.NATSURL)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil {
		return err
	}
	for _, w := range st.Workers {
		fmt.Fprintf(o.Out, "worker      %-10s pool %-6s pid %-7d ORT %-7s ep %s\n", w.Worker, w.Pool, w.PID, w.Runtime, w.EP)
	}
	if st.SpoolDir == "" {
		return fmt.Errorf("the demo writes its images to security.spool_dir; set it in %s", o.Config)
	}
	imgs, err := writeImages(st.SpoolDir)
	if err != nil {
		return err
	}
	if err := requests(ctx, o.Out, c, imgs); err != nil {
		return err
	}
	if err := collide(ctx, o.Out, c, imgs); err != nil {
		return err
	}
	if o.Stay != nil {
		fmt.Fprintf(o.Out, "\nthe gateway and its page http://%s/ stay up until interrupted (Ctrl-C)\n", ready.HTTP)
		<-o.Stay
	}
	return nil
}

// stayNote says how long the page is there.
func stayNote(stay bool) string {
	if stay {
		return "up until interrupted"
	}
	return "while the demo runs; `ortbus demo -stay` keeps it up"
}

var demoColours = map[string]color.RGBA{
	"red": {255, 0, 0, 255}, "green": {0, 255, 0, 255}, "blue": {0, 0, 255, 255}, "yellow": {255, 255, 0, 255},
	"cyan": {0, 255, 255, 255}, "magenta": {255, 0, 255, 255}, "white": {255, 255, 255, 255}, "black": {0, 0, 0, 255},
}

// writeImages writes uniform colour images, a split "character" and a red "person".
func writeImages(dir string) (map[string]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	paths := map[string]string{}
	for name, c := range demoColours {
		paths[name] = filepath.Join(dir, name+".png")
		if err := writePNG(paths[name], 96, 96, func(x, y int) color.RGBA { return c }); err != nil {
			return nil, err
		}
	}
	paths["split"] = filepath.Join(dir, "split.png")
	if err := writePNG(paths["split"], 128, 96, func(x, y int) color.RGBA {
		if x < 64 {
			return demoColours["white"]
		}
		return demoColours["black"]
	}); err != nil {
		return nil, err
	}
	paths["person"] = filepath.Join(dir, "person.png")
	if err := writePNG(paths["person"], 400, 300, func(x, y int) color.RGBA {
		if x >= 120 && x < 200 && y >= 60 && y < 260 {
			return demoColours["red"]
		}
		return demoColours["white"]
	}); err != nil {
		return nil, err
	}
	return paths, nil
}

func writePNG(path string, w, h int, px func(x, y int) color.RGBA) error {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			img.SetRGBA(x, y, px(x, y))
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func requests(ctx context.Context, w io.Writer, c *client.Client, imgs map[string]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "\nop\tclass\tpool\tworker\tORT\tresult\tinfer_us\ttotal_us")
	row := func(op, class string, s *codec.Served, result string) {
		pool := s.Pool
		if s.Timing.Cached {
			pool = "cache (" + s.Pool + "'s)" // answered from the result cache: computed by that pool before
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", op, class, pool, s.Worker, s.Runtime, result, s.Timing.InferUS, s.Timing.TotalUS)
	}
	for _, class := range []string{subjects.ClassInteractive, subjects.ClassBatch} {
		for _, name := range []string{"red", "blue", "split"} {
			r, err := c.Tag(ctx, codec.Request{Path: imgs[name], Class: class})
			if err != nil {
				return fmt.Errorf("tag %s (%s): %w", name, class, err)
			}
			row("tag "+name, class, &r.Served, tagSummary(r))
		}
	}
	feats := map[string]codec.FloatVec{}
	for _, name := range []string{"red", "blue"} {
		r, err := c.Embed(ctx, codec.Request{Path: imgs[name]})
		if err != nil {
			return fmt.Errorf("embed %s: %w", name, err)
		}
		feats[name] = r.Embedding
		row("embed "+name, subjects.ClassInteractive, &r.Served, fmt.Sprintf("dim %d", r.Dim))
	}
	cr, err := c.Compare(ctx, codec.Request{Feature: feats["red"], Candidates: []codec.FloatVec{feats["red"], feats["blue"]}})
	if err != nil {
		return fmt.Errorf("compare: %w", err)
	}
	row("compare red~[red,blue]", subjects.ClassInteractive, &cr.Served, fmt.Sprintf("diff %.3f %.3f same %v (thr %.3f)", cr.Differences[0], cr.Differences[1], cr.Same, cr.Threshold))
	dr, err := c.Detect(ctx, codec.Request{Path: imgs["person"]})
	if err != nil {
		return fmt.Errorf("detect: %w", err)
	}
	res := "no boxes"
	if len(dr.Boxes) > 0 {
		b := dr.Boxes[0]
		res = fmt.Sprintf("%s %.2f [%.0f %.0f %.0f %.0f]", b.Label, b.Score, b.X1, b.Y1, b.X2, b.Y2)
	}
	row("detect person", subjects.ClassInteractive, &dr.Served, res)
	sr, err := c.Segment(ctx, codec.Request{Path: imgs["person"]})
	if err != nil {
		return fmt.Errorf("segment: %w", err)
	}
	row("segment person", subjects.ClassInteractive, &sr.Served, fmt.Sprintf("%dx%d -> %s", sr.Width, sr.Height, filepath.Base(sr.OutPath)))
	_, err = c.Tag(ctx, codec.Request{Path: "/etc/passwd"})
	fmt.Fprintf(tw, "tag /etc/passwd\tinteractive\t-\t-\t-\terror %s\t\t\n", codec.CodeOf(err))
	if codec.CodeOf(err) != codec.CodeForbiddenPath {
		return fmt.Errorf("a path outside the allowed roots was not refused: %v", err)
	}
	return nil
}

// collide runs a burst of batch tagging while interactive requests keep coming, and
// reports who served what: interactive and batch work run on different pools (and
// runtimes) at the same time.
func collide(ctx context.Context, w io.Writer, c *client.Client, imgs map[string]string) error {
	const nBatch, nInteractive = 200, 20
	names := []string{"red", "green", "blue", "yellow", "cyan", "magenta", "white", "black"}
	results := make(chan burstResult, nBatch+nInteractive)
	t0 := time.Now()
	for i := 0; i < nBatch; i++ {
		go func(i int) {
			s := time.Now()
			r, err := c.Tag(ctx, codec.Request{Path: imgs[names[i%len(names)]], Class: subjects.ClassBatch})
			results <- burstResult{subjects.ClassBatch, r.Pool, r.Timing.Cached, time.Since(s), err}
		}(i)
	}
	for i := 0; i < nInteractive; i++ {
		s := time.Now()
		r, err := c.Tag(ctx, codec.Request{Path: imgs[names[i%len(names)]]})
		results <- burstResult{subjects.ClassInteractive, r.Pool, r.Timing.Cached, time.Since(s), err}
	}
	all := make([]burstResult, 0, nBatch+nInteractive)
	for i := 0; i < nBatch+nInteractive; i++ {
		r := <-results
		if r.err != nil {
			return fmt.Errorf("%s request failed: %w", r.class, r.err)
		}
		all = append(all, r)
	}
	elapsed := time.Since(t0)
	fmt.Fprintf(w, "\nburst: %d batch + %d interactive tag requests at once, all answered in %s\n", nBatch, nInteractive, elapsed.Round(time.Millisecond))
	for _, line := range burstLines(all, subjects.ClassInteractive, subjects.ClassBatch) {
		fmt.Fprintln(w, line)
	}
	return nil
}

// burstResult is one answer of the burst.
type burstResult struct {
	class, pool string
	cached      bool // answered from the result cache ([cache]): no pool ran it
	d           time.Duration
	err         error
}

// burstLines are the burst's report, a line per class in classes' order: the pools that
// ran its requests and how many each, the answers from the result cache apart (their
// Served names the pool that once computed them, not one that ran them now), and the
// latency of them all.
func burstLines(all []burstResult, classes ...string) []string {
	var out []string
	for _, class := range classes {
		pools := map[string]int{}
		cached := 0
		var d []time.Duration
		for _, r := range all {
			if r.class != class {
				continue
			}
			d = append(d, r.d)
			if r.cached {
				cached++
			} else {
				pools[r.pool]++
			}
		}
		if len(d) == 0 {
			continue
		}
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		var ran []string
		for _, p := range slices.Sorted(maps.Keys(pools)) {
			ran = append(ran, fmt.Sprintf("%s:%d", p, pools[p]))
		}
		served := "run by " + strings.Join(ran, " ")
		if len(ran) == 0 {
			served = "run by no pool"
		}
		out = append(out, fmt.Sprintf("  %-12s %s, %d answered from the cache   p50 %s   max %s", class, served, cached,
			d[len(d)/2].Round(time.Microsecond), d[len(d)-1].Round(time.Microsecond)))
	}
	return out
}

func tagSummary(r *codec.TagReply) string {
	var parts []string
	for _, m := range []map[string]float32{r.General, r.Character} {
		var names []string
		for n := range m {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			parts = append(parts, fmt.Sprintf("%s %.2f", n, m[n]))
		}
	}
	if len(r.IPs) > 0 {
		parts = append(parts, "ips "+strings.Join(r.IPs, ","))
	}
	return strings.Join(parts, ", ")
}
