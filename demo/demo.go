// Package demo runs ortbus end to end on one machine from a config file: an embedded NATS
// server, one resident worker process per local pool worker, demo images written under
// the spool directory, and a round of real requests of every op, printed as a report.
// `make demo` runs it on deploy/local.toml.
package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/natsd"
	"github.com/ortbus/ortbus/subjects"
)

// Options for Run.
type Options struct {
	Config string
	// WorkerBin is the ortworker executable.
	WorkerBin string
	Out       io.Writer
}

// Run runs the demo and returns an error if any request failed.
func Run(o Options) error {
	cfg, err := config.Load(o.Config)
	if err != nil {
		return err
	}
	if cfg.Security.SpoolDir == "" {
		return fmt.Errorf("the demo writes its images to security.spool_dir; set it in %s", o.Config)
	}
	opts, err := natsd.ParseArgs([]string{"-a", "127.0.0.1", "-p", "-1"})
	if err != nil {
		return err
	}
	srv, err := natsd.Start(opts)
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	url := srv.ClientURL()
	fmt.Fprintf(o.Out, "NATS        %s (embedded, loopback)\n", url)

	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			p.Process.Signal(syscall.SIGTERM)
			p.Wait()
		}
	}()
	for _, name := range cfg.PoolNames() {
		p := cfg.Pools[name]
		if !p.IsLocal() {
			continue
		}
		for i := 0; i < p.Workers; i++ {
			cmd, ready, err := startWorker(o.WorkerBin, o.Config, name, fmt.Sprintf("%s-%d", name, i), url, p.Env)
			if err != nil {
				return err
			}
			procs = append(procs, cmd)
			fmt.Fprintf(o.Out, "worker      %-10s pid %-7v ORT %-7v ep %v\n", ready["worker"], ready["pid"], ready["runtime"], ready["ep"])
		}
	}
	imgs, err := writeImages(cfg.Security.SpoolDir)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	return requests(o.Out, nc, cfg, imgs)
}

func startWorker(bin, cfgPath, pool, id, url string, env map[string]string) (*exec.Cmd, map[string]any, error) {
	cmd := exec.Command(bin, "-config", cfgPath, "-pool", pool, "-id", id, "-nats", url)
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stderr = io.Discard
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start %s: %w", bin, err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var ev map[string]any
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			continue
		}
		switch ev["event"] {
		case "ready":
			go io.Copy(io.Discard, out)
			return cmd, ev, nil
		case "failed":
			cmd.Wait()
			return nil, nil, fmt.Errorf("worker of pool %s failed to start: %v", pool, ev["error"])
		}
	}
	cmd.Wait()
	return nil, nil, fmt.Errorf("worker of pool %s exited before it was ready", pool)
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

// call sends one work item to infer.<pool>.<class> and decodes the reply into out.
func call(nc *nats.Conn, pool, class string, item *codec.WorkItem, out codec.Replier) error {
	subj, err := subjects.Infer(pool, class)
	if err != nil {
		return err
	}
	b, err := codec.Marshal(item)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, subj, b)
	if err != nil {
		return fmt.Errorf("%s %s: %w", subj, item.Op, err)
	}
	if msg.Header.Get("Nats-Service-Error-Code") != "" {
		var e codec.Error
		codec.Unmarshal(msg.Data, &e)
		return &e
	}
	return codec.Unmarshal(msg.Data, out)
}

func requests(w io.Writer, nc *nats.Conn, cfg *config.Config, imgs map[string]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "\nop\tclass\tpool\tworker\tORT\tresult\tinfer_us\ttotal_us")
	row := func(op, class string, s *codec.Served, result string) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", op, class, s.Pool, s.Worker, s.Runtime, result, s.Timing.InferUS, s.Timing.TotalUS)
	}
	interactive := firstPool(cfg, subjects.ClassInteractive)
	batch := firstPool(cfg, subjects.ClassBatch)
	for _, c := range []struct{ pool, class string }{{interactive, subjects.ClassInteractive}, {batch, subjects.ClassBatch}} {
		if c.pool == "" {
			continue
		}
		for _, name := range []string{"red", "blue", "split"} {
			var r codec.TagReply
			if err := call(nc, c.pool, c.class, &codec.WorkItem{Op: "tag", Request: codec.Request{Path: imgs[name]}}, &r); err != nil {
				return err
			}
			row("tag "+name, c.class, &r.Served, tagSummary(&r))
		}
	}
	if interactive == "" {
		return nil
	}
	feats := map[string]codec.FloatVec{}
	for _, name := range []string{"red", "blue"} {
		var r codec.EmbedReply
		if err := call(nc, interactive, subjects.ClassInteractive, &codec.WorkItem{Op: "embed", Request: codec.Request{Path: imgs[name]}}, &r); err != nil {
			return err
		}
		feats[name] = r.Embedding
		row("embed "+name, subjects.ClassInteractive, &r.Served, fmt.Sprintf("dim %d", r.Dim))
	}
	var cr codec.CompareReply
	if err := call(nc, interactive, subjects.ClassInteractive, &codec.WorkItem{Op: "compare", Request: codec.Request{Feature: feats["red"], Candidates: []codec.FloatVec{feats["red"], feats["blue"]}}}, &cr); err != nil {
		return err
	}
	row("compare red~[red,blue]", subjects.ClassInteractive, &cr.Served, fmt.Sprintf("diff %.3f %.3f same %v (thr %.3f)", cr.Differences[0], cr.Differences[1], cr.Same, cr.Threshold))
	var dr codec.DetectReply
	if err := call(nc, interactive, subjects.ClassInteractive, &codec.WorkItem{Op: "detect", Request: codec.Request{Path: imgs["person"]}}, &dr); err == nil {
		res := "no boxes"
		if len(dr.Boxes) > 0 {
			b := dr.Boxes[0]
			res = fmt.Sprintf("%s %.2f [%.0f %.0f %.0f %.0f]", b.Label, b.Score, b.X1, b.Y1, b.X2, b.Y2)
		}
		row("detect person", subjects.ClassInteractive, &dr.Served, res)
	} else if codec.CodeOf(err) != codec.CodeUnknownOp {
		return err
	}
	var sr codec.SegmentReply
	if err := call(nc, interactive, subjects.ClassInteractive, &codec.WorkItem{Op: "segment", Request: codec.Request{Path: imgs["person"]}}, &sr); err == nil {
		row("segment person", subjects.ClassInteractive, &sr.Served, fmt.Sprintf("%dx%d -> %s", sr.Width, sr.Height, filepath.Base(sr.OutPath)))
	} else if codec.CodeOf(err) != codec.CodeUnknownOp {
		return err
	}
	return nil
}

func firstPool(cfg *config.Config, class string) string {
	if c, ok := cfg.Classes[class]; ok && len(c.Chain) > 0 {
		return c.Chain[0]
	}
	return ""
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
