package test

import (
	"encoding/binary"
	"encoding/csv"
	"encoding/json"
	"hash/crc32"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// TestTwoRuntimes runs two worker processes of different pools at once, one on ONNX
// Runtime 1.30.0 and one on 1.24.3, and checks each reports its own runtime (heartbeat,
// replies) and serves every model kind correctly.
func TestTwoRuntimes(t *testing.T) {
	t.Parallel()
	procs, _ := sharedWorkers(t)
	nc := connect(t)
	waitHB := heartbeats(t, nc)
	for _, pc := range sharedPools {
		p := procs[pc.Name]
		if p.Ready.Runtime != pc.Version || p.Ready.EP != "cpu" {
			t.Errorf("%s ready line: runtime %q ep %q, want %s cpu", p.ID, p.Ready.Runtime, p.Ready.EP, pc.Version)
		}
		hb := waitHB(p.ID, nil)
		if hb.Runtime != pc.Version || hb.EP != "cpu" || hb.Pool != pc.Name || hb.State != codec.StateReady {
			t.Errorf("%s heartbeat: runtime %q ep %q pool %q state %q, want %s cpu %s ready", p.ID, hb.Runtime, hb.EP, hb.Pool, hb.State, pc.Version, pc.Name)
		}
		var names []string
		for _, m := range hb.Models {
			names = append(names, m.Name)
		}
		if !slices.Equal(names, pc.Models) {
			t.Errorf("%s heartbeat models %v, want %v", p.ID, names, pc.Models)
		}
	}
	for _, pc := range sharedPools {
		t.Run(pc.Name, func(t *testing.T) {
			t.Parallel()
			checkServes(t, nc, procs[pc.Name], pc.Version)
		})
	}
}

// checkServes sends one request of each op to a shared worker and checks the answers
// against what the generated models are built to give.
func checkServes(t *testing.T, nc *nats.Conn, p *proc, version string) {
	dir := sharedDir(t)
	served := func(what string, s *codec.Served, model string) {
		t.Helper()
		if s.Runtime != version || s.EP != "cpu" || s.Pool != p.Pool || s.Worker != p.ID || s.Model != model {
			t.Errorf("%s reply served by %+v, want runtime %s ep cpu pool %s worker %s model %s", what, *s, version, p.Pool, p.ID, model)
		}
		if s.Timing.TotalUS <= 0 || s.Timing.InferUS <= 0 || s.Timing.Batch != 1 {
			t.Errorf("%s reply timing %+v, want positive times and batch 1", what, s.Timing)
		}
	}

	t.Run("tag-colour", func(t *testing.T) {
		red := colourPNG(t, dir, "red")
		var r codec.TagReply
		result(t, request(t, nc, p.Pool, "interactive", tagItem("tag-red", red)), &r)
		served("tag", &r.Served, "tagger")
		if r.ID != "tag-red" {
			t.Errorf("reply id %q, want tag-red", r.ID)
		}
		checkColourTag(t, &r, "red")
		if len(r.Character) != 0 || len(r.IPs) != 0 {
			t.Errorf("red image: characters %v, ips %v, want none", r.Character, r.IPs)
		}
		if len(r.Rating) != 4 {
			t.Errorf("rating %v, want the four ratings", r.Rating)
		}
	})

	t.Run("tag-character", func(t *testing.T) {
		white, black := onnxgen.ColourNames["white"], onnxgen.ColourNames["black"]
		path := writePNG(t, dir, "split.png", 256, 192, onnxgen.Split(white, black, 256))
		var r codec.TagReply
		result(t, request(t, nc, p.Pool, "interactive", tagItem("", path)), &r)
		served("tag", &r.Served, "tagger")
		wantIPs := labelIPs(t, onnxgen.TagSplitHero)
		if len(wantIPs) == 0 {
			t.Fatalf("the label file gives %s no ips", onnxgen.TagSplitHero)
		}
		if s, ok := r.Character[onnxgen.TagSplitHero]; !ok || s < 0.7 {
			t.Errorf("character %v, want %s >= 0.7", r.Character, onnxgen.TagSplitHero)
		}
		if _, ok := r.Character[onnxgen.TagMirrorHero]; ok {
			t.Errorf("character %v also has %s", r.Character, onnxgen.TagMirrorHero)
		}
		if !slices.Equal(r.IPs, wantIPs) {
			t.Errorf("ips %v, want %v (the label file's)", r.IPs, wantIPs)
		}
		if len(r.IPsMapping) != 1 || !slices.Equal(r.IPsMapping[onnxgen.TagSplitHero], wantIPs) {
			t.Errorf("ips_mapping %v, want {%s: %v}", r.IPsMapping, onnxgen.TagSplitHero, wantIPs)
		}
	})

	t.Run("embed-compare", func(t *testing.T) {
		embed := func(colour string) codec.FloatVec {
			t.Helper()
			item := &codec.WorkItem{Request: codec.Request{Path: colourPNG(t, dir, colour)}, Op: "embed"}
			var r codec.EmbedReply
			result(t, request(t, nc, p.Pool, "interactive", item), &r)
			served("embed", &r.Served, "ccip")
			if r.Dim != onnxgen.CCIPDim || len(r.Embedding) != onnxgen.CCIPDim {
				t.Fatalf("embed %s: dim %d, %d values, want %d", colour, r.Dim, len(r.Embedding), onnxgen.CCIPDim)
			}
			// A uniform image stays uniform when resized, so the reference sees the same input.
			ref := onnxgen.RefCCIPFeature(onnxgen.NCHW(onnxgen.CCIPSize, onnxgen.CCIPNorm, onnxgen.Solid(onnxgen.ColourNames[colour])), 1)
			worst := 0.0
			for i := range ref {
				worst = max(worst, math.Abs(float64(r.Embedding[i]-ref[i])))
			}
			t.Logf("embed %s: largest difference from the reference %.3g", colour, worst)
			if worst > 1e-5 {
				t.Errorf("embed %s: differs from onnxgen.RefCCIPFeature by up to %g, want <= 1e-5", colour, worst)
			}
			return r.Embedding
		}
		red, blue := embed("red"), embed("blue")
		item := &codec.WorkItem{Request: codec.Request{Feature: red, Candidates: []codec.FloatVec{red, blue}}, Op: "compare"}
		var r codec.CompareReply
		result(t, request(t, nc, p.Pool, "interactive", item), &r)
		served("compare", &r.Served, "ccip")
		if r.Threshold != onnxgen.CCIPThreshold {
			t.Errorf("threshold %v, want %v", r.Threshold, onnxgen.CCIPThreshold)
		}
		if len(r.Differences) != 2 || len(r.Same) != 2 {
			t.Fatalf("compare reply %+v, want two differences", r)
		}
		if !(float64(r.Differences[0]) <= r.Threshold) || !r.Same[0] {
			t.Errorf("red vs red: difference %v same %v, want <= %v and same", r.Differences[0], r.Same[0], r.Threshold)
		}
		if !(float64(r.Differences[1]) > r.Threshold) || r.Same[1] {
			t.Errorf("red vs blue: difference %v same %v, want > %v and not same", r.Differences[1], r.Same[1], r.Threshold)
		}
	})

	// A red rectangle on white in a non-square image: the detector sees it letterboxed, so
	// the box is right only if it is mapped back to the original image.
	const w, h, x1, y1, x2, y2 = 400, 300, 100, 80, 250, 200
	rect := writePNG(t, dir, "rect.png", w, h, onnxgen.Rect(onnxgen.ColourNames["white"], onnxgen.ColourNames["red"], x1, y1, x2, y2))

	t.Run("detect", func(t *testing.T) {
		var r codec.DetectReply
		result(t, request(t, nc, p.Pool, "interactive", &codec.WorkItem{Request: codec.Request{Path: rect}, Op: "detect"}), &r)
		served("detect", &r.Served, "detector")
		if len(r.Boxes) != 1 {
			t.Fatalf("boxes %+v, want one", r.Boxes)
		}
		b := r.Boxes[0]
		t.Logf("box %+v", b)
		if b.Label != "person" || b.Score < onnxgen.DetectorConf {
			t.Errorf("box %+v, want label person with score >= %v", b, onnxgen.DetectorConf)
		}
		const tol = 3
		for _, c := range []struct {
			name      string
			got, want float32
		}{{"x1", b.X1, x1}, {"y1", b.Y1, y1}, {"x2", b.X2, x2}, {"y2", b.Y2, y2}} {
			if math.Abs(float64(c.got-c.want)) > tol {
				t.Errorf("box %s = %v, want %v within %d px (box %+v)", c.name, c.got, c.want, tol, b)
			}
		}
	})

	t.Run("segment", func(t *testing.T) {
		out := filepath.Join(dir, "rect-mask.png")
		var r codec.SegmentReply
		result(t, request(t, nc, p.Pool, "interactive", &codec.WorkItem{Request: codec.Request{Path: rect, OutPath: out}, Op: "segment"}), &r)
		served("segment", &r.Served, "segmenter")
		if r.OutPath != out || r.Width != w || r.Height != h {
			t.Errorf("segment reply out_path %q %dx%d, want %q %dx%d", r.OutPath, r.Width, r.Height, out, w, h)
		}
		f, err := os.Open(out)
		if err != nil {
			t.Fatalf("segment output: %v", err)
		}
		defer f.Close()
		img, err := png.Decode(f)
		if err != nil {
			t.Fatalf("segment output is not a PNG: %v", err)
		}
		if b := img.Bounds(); b.Dx() != w || b.Dy() != h {
			t.Fatalf("mask PNG is %dx%d, want %dx%d", b.Dx(), b.Dy(), w, h)
		}
		alpha := func(x, y int) uint32 { _, _, _, a := img.At(x, y).RGBA(); return a >> 8 }
		for _, pt := range [][2]int{{(x1 + x2) / 2, (y1 + y2) / 2}, {x1 + 5, y1 + 5}, {x2 - 5, y2 - 5}} {
			if a := alpha(pt[0], pt[1]); a < 200 {
				t.Errorf("alpha at foreground %v = %d, want >= 200", pt, a)
			}
		}
		for _, pt := range [][2]int{{5, 5}, {w - 5, h - 5}, {x2 + 30, y1}} {
			if a := alpha(pt[0], pt[1]); a > 50 {
				t.Errorf("alpha at white background %v = %d, want <= 50", pt, a)
			}
		}
	})
}

// labelIPs reads the IPs of a character tag from the generated tagger's label file.
func labelIPs(t testing.TB, tag string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(modelsDir(t), onnxgen.TaggerDir, onnxgen.SelectedTagsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	for _, row := range rows[1:] {
		if row[col["name"]] == tag {
			var ips []string
			if err := json.Unmarshal([]byte(row[col["ips"]]), &ips); err != nil {
				t.Fatalf("ips of %s: %v", tag, err)
			}
			if cat, _ := strconv.Atoi(row[col["category"]]); cat != onnxgen.CategoryCharacter {
				t.Fatalf("%s has category %d, not character", tag, cat)
			}
			return ips
		}
	}
	t.Fatalf("no %s in the label file", tag)
	return nil
}

// TestStartFailures checks that a worker that cannot serve says why at once and exits,
// and that a configured EP fallback serves instead.
func TestStartFailures(t *testing.T) {
	t.Parallel()

	t.Run("runtime-missing", func(t *testing.T) {
		t.Parallel()
		missing := filepath.Join(t.TempDir(), "no-such-ort", "lib", "libonnxruntime.so.1")
		cfg := writeConfig(t, imageRoot(t), poolCfg{Name: "pmissing", Runtime: missing, Models: []string{"tagger"}})
		waitHB := heartbeats(t, connect(t))
		p := launch(t, cfg, "pmissing")
		ev := p.event(t)
		st := p.wait(t)
		took := time.Since(p.lp.Started())
		t.Logf("exited %v after %v", st, took)
		if st.Success() {
			t.Errorf("exit %v, want non-zero", st)
		}
		if took > 2*time.Second {
			t.Errorf("exited after %v, want within 2s", took)
		}
		if ev.Event != codec.EventFailed || ev.Error == nil || ev.Error.Code != codec.CodeRuntimeMissing {
			t.Fatalf("start line %+v (error %+v), want failed with runtime_missing", ev, ev.Error)
		}
		if ev.Worker != p.ID || ev.Pool != "pmissing" {
			t.Errorf("failed line names worker %q pool %q, want %s pmissing", ev.Worker, ev.Pool, p.ID)
		}
		searched, _ := ev.Error.Details["searched"].([]any)
		if !slices.Contains(searched, any(missing)) {
			t.Errorf("details.searched = %v, want it to list %s", ev.Error.Details["searched"], missing)
		}
		if ev.Error.Details["pool"] != "pmissing" {
			t.Errorf("details.pool = %v, want pmissing", ev.Error.Details["pool"])
		}
		// It also says so on the bus, for gateways and operators.
		hb := waitHB(p.ID, nil)
		if hb.State != codec.StateFailed || hb.Error == nil || hb.Error.Code != codec.CodeRuntimeMissing {
			t.Errorf("heartbeat state %q error %+v, want failed with runtime_missing", hb.State, hb.Error)
		}
	})

	t.Run("provider-unavailable", func(t *testing.T) {
		t.Parallel()
		cfg := writeConfig(t, imageRoot(t), poolCfg{Name: "pcuda", Version: "1.30.0", EP: "cuda", Models: []string{"tagger"}})
		p := launch(t, cfg, "pcuda")
		ev := p.event(t)
		if st := p.wait(t); st.Success() {
			t.Errorf("exit %v, want non-zero", st)
		}
		if ev.Event != codec.EventFailed || ev.Error == nil || ev.Error.Code != codec.CodeProviderUnavailable {
			t.Fatalf("start line %+v (error %+v), want failed with provider_unavailable", ev, ev.Error)
		}
		msg := ev.Error.Message
		t.Logf("provider_unavailable: %s", msg)
		if !containsAny(msg, "providers_shared", "Failed to load") {
			t.Errorf("message %q does not carry the runtime's own error text", msg)
		}
		if ev.Error.Details["ep"] != "cuda" {
			t.Errorf("details.ep = %v, want cuda (details %v)", ev.Error.Details["ep"], ev.Error.Details)
		}
	})

	t.Run("fallback-cpu", func(t *testing.T) {
		t.Parallel()
		root := imageRoot(t)
		cfg := writeConfig(t, root, poolCfg{Name: "pfallback", Version: "1.30.0", EP: "cuda", Fallback: []string{"cpu"}, Models: []string{"tagger"}})
		nc := connect(t)
		waitHB := heartbeats(t, nc)
		p := startWorker(t, cfg, "pfallback")
		if p.Ready.EP != "cpu" {
			t.Errorf("ready line ep %q, want cpu", p.Ready.EP)
		}
		if hb := waitHB(p.ID, nil); hb.EP != "cpu" {
			t.Errorf("heartbeat ep %q, want cpu", hb.EP)
		}
		var r codec.TagReply
		result(t, request(t, nc, "pfallback", "interactive", tagItem("", colourPNG(t, root, "green"))), &r)
		if r.EP != "cpu" || r.Runtime != "1.30.0" {
			t.Errorf("reply ep %q runtime %q, want cpu 1.30.0", r.EP, r.Runtime)
		}
		checkColourTag(t, &r, "green")
	})
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// TestModelsLoadedOnce checks that requests reuse the sessions opened at start-up: the
// heartbeat's sessions_created does not move over 30 requests of every kind, and the
// process is the same.
func TestModelsLoadedOnce(t *testing.T) {
	t.Parallel()
	procs, _ := sharedWorkers(t)
	p := procs[pool130]
	dir := sharedDir(t)
	nc := connect(t)
	waitHB := heartbeats(t, nc)
	before := waitHB(p.ID, nil)
	if before.SessionsCreated != sharedSessions {
		t.Errorf("sessions_created %d at start, want %d (tagger 1, ccip 2, detector 1, segmenter 1)", before.SessionsCreated, sharedSessions)
	}
	if before.PID != p.Ready.PID {
		t.Errorf("heartbeat pid %d, ready line pid %d", before.PID, p.Ready.PID)
	}

	in := newInbox(t, nc)
	red := colourPNG(t, dir, "red")
	rect := writePNG(t, dir, "rect.png", 120, 90, onnxgen.Rect(onnxgen.ColourNames["white"], onnxgen.ColourNames["red"], 20, 20, 60, 50))
	ops := []string{"tag", "embed", "detect"}
	const n = 30
	for i := 0; i < n; i++ {
		item := &codec.WorkItem{Request: codec.Request{Path: red}, Op: ops[i%len(ops)]}
		if item.Op == "detect" {
			item.Path = rect
		}
		send(t, nc, in, p.Pool, "interactive", strconv.Itoa(i), item)
	}
	for i := 0; i < n; i++ {
		m := in.next(t, "reply")
		if m.Header.Get("Nats-Service-Error-Code") != "" {
			t.Errorf("request %s: error %s", in.key(m), m.Header.Get("Nats-Service-Error"))
		}
	}
	after := waitHB(p.ID, func(hb *codec.Heartbeat) bool { return hb.Served >= before.Served+n })
	if after.SessionsCreated != before.SessionsCreated {
		t.Errorf("sessions_created went from %d to %d over %d requests", before.SessionsCreated, after.SessionsCreated, n)
	}
	if after.PID != before.PID || after.PID != p.lp.PID() {
		t.Errorf("pid went from %d to %d (process %d)", before.PID, after.PID, p.lp.PID())
	}
	if s := stats(t, nc, p.ID); s.SessionsCreated != before.SessionsCreated || s.PID != before.PID {
		t.Errorf("stats: sessions_created %d pid %d, want %d %d", s.SessionsCreated, s.PID, before.SessionsCreated, before.PID)
	}
}

// TestBadInputs sends work items that must each be refused with their own code, exactly
// once, with the error headers set.
func TestBadInputs(t *testing.T) {
	t.Parallel()
	procs, _ := sharedWorkers(t)
	p := procs[pool130]
	dir := sharedDir(t)
	nc := connect(t)
	in := newInbox(t, nc)

	outside := t.TempDir()
	outsideFile := colourPNG(t, outside, "blue")
	red := colourPNG(t, dir, "red")

	write := func(name string, data []byte) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	subdir := filepath.Join(dir, "a-directory.png")
	if err := os.Mkdir(subdir, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.png")
	if err := os.Symlink(outsideFile, link); err != nil {
		t.Fatal(err)
	}
	noisy := writePNG(t, dir, "noisy.png", 96, 96, func(x, y int) [3]uint8 { return [3]uint8{uint8(x * 37), uint8(y * 91), uint8(x*y + 7)} })
	full, err := os.ReadFile(noisy)
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name string
		item *codec.WorkItem // sent as msgpack unless raw is set
		raw  []byte
		json bool
		want codec.Code
	}{
		{name: "missing-file", item: tagItem("", filepath.Join(dir, "missing.png")), want: codec.CodeFileNotFound},
		{name: "directory", item: tagItem("", subdir), want: codec.CodeUnsupportedImage},
		{name: "text-as-png", item: tagItem("", write("text.png", []byte("this is not an image\n"))), want: codec.CodeUnsupportedImage},
		{name: "truncated-png", item: tagItem("", write("truncated.png", full[:len(full)*2/3])), want: codec.CodeUnsupportedImage},
		{name: "huge-png", item: tagItem("", write("huge.png", pngHeader(100000, 100000))), want: codec.CodeImageTooLarge},
		{name: "outside-root", item: tagItem("", outsideFile), want: codec.CodeForbiddenPath},
		{name: "symlink-out", item: tagItem("", link), want: codec.CodeForbiddenPath},
		{name: "segment-out-exists", item: &codec.WorkItem{Request: codec.Request{Path: red, OutPath: red}, Op: "segment"}, want: codec.CodeForbiddenPath},
		{name: "segment-out-outside", item: &codec.WorkItem{Request: codec.Request{Path: red, OutPath: filepath.Join(outside, "mask.png")}, Op: "segment"}, want: codec.CodeForbiddenPath},
		{name: "malformed-msgpack", raw: []byte{0x85, 0xa2, 'i', 'd', 0xc1}, want: codec.CodeBadRequest},
		{name: "unknown-model", item: &codec.WorkItem{Request: codec.Request{Model: "no_such_model", Path: red}, Op: "tag"}, want: codec.CodeUnknownModel},
		{name: "json-missing-file", raw: mustJSON(t, map[string]any{"op": "tag", "path": filepath.Join(dir, "missing.png")}), json: true, want: codec.CodeFileNotFound},
	}
	for _, c := range cases {
		switch {
		case c.json:
			sendRaw(t, nc, in, p.Pool, "interactive", c.name, c.raw, nats.Header{"Content-Type": []string{codec.ContentTypeJSON}})
		case c.raw != nil:
			sendRaw(t, nc, in, p.Pool, "interactive", c.name, c.raw, nil)
		default:
			send(t, nc, in, p.Pool, "interactive", c.name, c.item)
		}
	}
	got := map[string][]*nats.Msg{}
	for len(got) < len(cases) {
		m := in.next(t, "error reply")
		got[in.key(m)] = append(got[in.key(m)], m)
	}
	// A barrier: with one slot, the worker answers this after every item above, so any
	// second reply to one of them would reach the inbox before it.
	send(t, nc, in, p.Pool, "interactive", "barrier", tagItem("", red))
	for {
		m := in.next(t, "barrier reply")
		got[in.key(m)] = append(got[in.key(m)], m)
		if in.key(m) == "barrier" {
			break
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ms := got[c.name]
			if len(ms) != 1 {
				t.Fatalf("%d replies, want exactly 1", len(ms))
			}
			e := replyError(t, ms[0], c.json)
			if e.Code != c.want {
				t.Errorf("code %s (%s), want %s", e.Code, e.Message, c.want)
			}
			if c.json && ms[0].Header.Get("Content-Type") != codec.ContentTypeJSON {
				t.Errorf("JSON request answered with Content-Type %q", ms[0].Header.Get("Content-Type"))
			}
		})
	}
	var r codec.TagReply
	result(t, got["barrier"][0], &r)
	checkColourTag(t, &r, "red")
}

// pngHeader is the start of a PNG that declares a w×h RGB image: the signature and a
// valid IHDR chunk, and no pixel data.
func pngHeader(w, h uint32) []byte {
	ihdr := make([]byte, 0, 17)
	ihdr = append(ihdr, "IHDR"...)
	ihdr = binary.BigEndian.AppendUint32(ihdr, w)
	ihdr = binary.BigEndian.AppendUint32(ihdr, h)
	ihdr = append(ihdr, 8, 2, 0, 0, 0) // 8-bit RGB, deflate, no filter, no interlace
	b := []byte("\x89PNG\r\n\x1a\n")
	b = binary.BigEndian.AppendUint32(b, 13)
	b = append(b, ihdr...)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(ihdr))
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDeadline checks that an item whose deadline has already passed is answered
// deadline_exceeded.
func TestDeadline(t *testing.T) {
	t.Parallel()
	procs, _ := sharedWorkers(t)
	dir := sharedDir(t)
	nc := connect(t)
	item := tagItem("late-1", colourPNG(t, dir, "red"))
	item.DeadlineUnixMS = time.Now().Add(-time.Second).UnixMilli()
	e := replyError(t, request(t, nc, procs[pool130].Pool, "interactive", item), false)
	if e.Code != codec.CodeDeadlineExceeded {
		t.Errorf("code %s (%s), want deadline_exceeded", e.Code, e.Message)
	}
}

// slowPool is a one-slot pool on the heavy tagger (one inference ~45 ms), without dynamic
// batching, serving interactive and batch: a queue builds up behind its one slot.
var slowPool = poolCfg{Name: "pslow", Version: "1.30.0", Slots: 1, Classes: []string{"interactive", "batch"}, Models: []string{"tagger_heavy"}}

// TestSlowPool checks scheduling on a busy one-slot worker: priority of interactive over
// queued batch work, cancelling a queued item, and draining the queue on SIGTERM. It is
// not parallel, so that other tests do not compete for the CPU while it measures order.
func TestSlowPool(t *testing.T) {
	root := imageRoot(t)
	cfg := writeConfig(t, root, slowPool)
	p := startWorker(t, cfg, slowPool.Name)
	nc := connect(t)
	red := colourPNG(t, root, "red")
	blue := colourPNG(t, root, "blue")

	// queue sends n batch items (ids prefix-0.., red) and waits until the worker has
	// claimed, that is queued, every one of them.
	queue := func(t *testing.T, in *inbox, prefix string, n int) {
		t.Helper()
		claims := newClaimInbox(t, nc)
		for i := 0; i < n; i++ {
			item := tagItem(prefix+strconv.Itoa(i), red)
			item.ClaimTo = claims.prefix
			item.Attempt = 1
			send(t, nc, in, p.Pool, "batch", item.ID, item)
		}
		seen := map[string]bool{}
		for len(seen) < n {
			var c codec.Claim
			if err := codec.Unmarshal(claims.next(t, "claim").Data, &c); err != nil {
				t.Fatal(err)
			}
			if c.State != codec.ClaimTaken || c.Worker != p.ID || c.Pool != p.Pool || c.Attempt != 1 {
				t.Errorf("claim %+v, want taken by %s of %s, attempt 1", c, p.ID, p.Pool)
			}
			seen[c.ID] = true
		}
	}

	t.Run("priority", func(t *testing.T) {
		in := newInbox(t, nc)
		const n = 20
		queue(t, in, "prio-batch-", n)
		send(t, nc, in, p.Pool, "interactive", "interactive", tagItem("prio-interactive", blue))
		var order []string
		var inferMS []float64
		for len(order) < n+1 {
			m := in.next(t, "reply")
			order = append(order, in.key(m))
			var r codec.TagReply
			result(t, m, &r)
			inferMS = append(inferMS, float64(r.Timing.InferUS)/1000)
			if in.key(m) == "interactive" {
				checkColourTag(t, &r, "blue")
			} else {
				checkColourTag(t, &r, "red")
			}
		}
		slices.Sort(inferMS)
		t.Logf("heavy tagger inference: min %.1f ms, median %.1f ms", inferMS[0], inferMS[len(inferMS)/2])
		before := slices.Index(order, "interactive")
		t.Logf("interactive reply came after %d of %d batch replies", before, n)
		if before > 1 {
			t.Errorf("interactive reply came after %d batch replies, want at most 1 (order %v)", before, order)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		in := newInbox(t, nc)
		queue(t, in, "cancel-busy-", 3)
		victim := tagItem("cancel-victim", red)
		claims := newClaimInbox(t, nc)
		victim.ClaimTo = claims.prefix
		send(t, nc, in, p.Pool, "batch", "victim", victim)
		claims.next(t, "victim's claim")
		got := map[string]*nats.Msg{}
		b, err := codec.Marshal(&codec.Cancel{ID: victim.ID})
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish("ortbus.cancel", b); err != nil {
			t.Fatal(err)
		}
		for len(got) < 4 {
			m := in.next(t, "reply")
			got[in.key(m)] = m
		}
		if e := replyError(t, got["victim"], false); e.Code != codec.CodeCancelled {
			t.Errorf("cancelled item answered %s (%s), want cancelled", e.Code, e.Message)
		}
		for i := 0; i < 3; i++ {
			var r codec.TagReply
			result(t, got["cancel-busy-"+strconv.Itoa(i)], &r)
		}
	})

	// Last: it stops the worker.
	t.Run("drain", func(t *testing.T) {
		in := newInbox(t, nc)
		const n = 10
		queue(t, in, "drain-", n)
		if err := p.lp.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			m := in.next(t, "reply after SIGTERM")
			var r codec.TagReply
			result(t, m, &r)
			checkColourTag(t, &r, "red")
		}
		st := p.wait(t)
		if !st.Success() {
			t.Errorf("worker exited %v after SIGTERM, want exit 0", st)
		}
	})
}

// TestFaultInjection crashes one worker natively (a real SIGSEGV, by the test-only fault
// switch) and checks that it dies of the signal while a worker of another pool keeps
// serving.
func TestFaultInjection(t *testing.T) {
	t.Parallel()
	root := imageRoot(t)
	cfg := writeConfig(t, root,
		poolCfg{Name: "pfault", Version: "1.30.0", Models: []string{"tagger"}},
		poolCfg{Name: "psurvivor", Version: "1.24.3", Models: []string{"tagger"}},
	)
	victim := launch(t, cfg, "pfault", "ORTBUS_FAULT_INJECT=1")
	survivor := launch(t, cfg, "psurvivor")
	victim.ready(t)
	survivor.ready(t)
	nc := connect(t)
	red := colourPNG(t, root, "red")

	var r codec.TagReply
	result(t, request(t, nc, "pfault", "interactive", tagItem("", red)), &r)
	checkColourTag(t, &r, "red")

	crash := writePNG(t, root, "x"+"__ortbus_fault_segv__"+".png", 32, 32, onnxgen.Solid(onnxgen.ColourNames["red"]))
	in := newInbox(t, nc)
	send(t, nc, in, "pfault", "interactive", "crash", tagItem("", crash))
	st := victim.wait(t)
	ws, ok := st.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGSEGV {
		t.Errorf("faulted worker exited %v, want killed by SIGSEGV", st)
	}

	for _, colour := range []string{"green", "yellow"} {
		var r codec.TagReply
		result(t, request(t, nc, "psurvivor", "interactive", tagItem("", colourPNG(t, root, colour))), &r)
		checkColourTag(t, &r, colour)
		if r.Worker != survivor.ID {
			t.Errorf("answered by %s, want %s", r.Worker, survivor.ID)
		}
	}
}

// TestDynamicBatching sends a burst of batch items to a pool with max_batch 8 and checks
// every answer is right and that some were run together.
func TestDynamicBatching(t *testing.T) {
	t.Parallel()
	root := imageRoot(t)
	cfg := writeConfig(t, root, poolCfg{Name: "pbatch", Version: "1.30.0", MaxBatch: 8, MaxDelay: "20ms", Classes: []string{"batch"}, Models: []string{"tagger"}})
	p := startWorker(t, cfg, "pbatch")
	nc := connect(t)
	in := newInbox(t, nc)
	paths := map[string]string{}
	for _, c := range onnxgen.Colours {
		paths[c.Name] = colourPNG(t, root, c.Name)
	}
	const rounds = 3
	for i := 0; i < rounds; i++ {
		for _, c := range onnxgen.Colours {
			key := c.Name + "-" + strconv.Itoa(i)
			send(t, nc, in, p.Pool, "batch", key, tagItem(key, paths[c.Name]))
		}
	}
	n := rounds * len(onnxgen.Colours)
	maxBatch := 0
	seen := map[string]bool{}
	for len(seen) < n {
		m := in.next(t, "reply")
		key := in.key(m)
		if seen[key] {
			t.Errorf("second reply to %s", key)
		}
		seen[key] = true
		var r codec.TagReply
		result(t, m, &r)
		colour, _, _ := strings.Cut(key, "-")
		checkColourTag(t, &r, colour)
		if r.ID != key {
			t.Errorf("reply to %s has id %q", key, r.ID)
		}
		if r.Timing.Batch < 1 || r.Timing.Batch > 8 {
			t.Errorf("reply to %s: timing.batch %d, want 1..8", key, r.Timing.Batch)
		}
		maxBatch = max(maxBatch, r.Timing.Batch)
	}
	t.Logf("largest batch: %d", maxBatch)
	if maxBatch < 2 {
		t.Errorf("no reply was batched (largest timing.batch %d), want some > 1", maxBatch)
	}
}
