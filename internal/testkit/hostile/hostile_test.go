package hostile

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ortbus/ortbus/codec"
)

func conf(v float64) *float64 { return &v }

// samples are valid messages of every kind the bus carries.
func samples() map[string]any {
	return map[string]any{
		"request-tag": &codec.Request{ID: "r1", Path: "/srv/img/red.png", Class: "interactive", Model: "tagger", TimeoutMS: 5000,
			Thresholds: &codec.Thresholds{General: conf(0.5)}},
		"request-compare": &codec.Request{Class: "interactive", Feature: codec.FloatVec{0.1, 0.2}, Candidates: []codec.FloatVec{{0.1, 0.2}, {0.3, 0.4}}},
		"request-segment": &codec.Request{Path: "/srv/img/red.png", OutPath: "/srv/img/spool/out.png", Class: "interactive"},
		"request-detect":  &codec.Request{Path: "/srv/img/red.png", Conf: conf(0.25), IoU: conf(0.7), Pool: "fast"},
		"request-infer": &codec.Request{Model: "tiny", Inputs: map[string]*codec.Tensor{"x": {Type: "float32", Shape: []int64{1, 2}, Data: make([]byte, 8)}},
			Outputs: []string{"y"}},
		"workitem": &codec.WorkItem{Request: codec.Request{ID: "w1", Path: "/srv/img/red.png"}, Op: "tag", DeadlineUnixMS: 1 << 41, Attempt: 1,
			ClaimTo: "ortbus.claim.gw-1", EnqueuedUnixUS: 1 << 50},
		"heartbeat": &codec.Heartbeat{V: 1, Worker: "fast-0", Pool: "fast", Host: "h", PID: 42, Seq: 7, State: codec.StateReady, Runtime: "1.30.0",
			EP: "cpu", IntervalMS: 1000, Classes: []string{"interactive"}, Slots: 1, Queued: map[string]int{"interactive": 0},
			Models: []codec.ModelStatus{{Name: "tagger", Kind: "tagger-pixai", Loaded: true, PeakBytes: 1 << 20}}},
		"claim":        &codec.Claim{ID: "r1", Worker: "fast-0", Pool: "fast", Attempt: 1, State: codec.ClaimTaken},
		"cancel":       &codec.Cancel{ID: "r1"},
		"gateway-beat": &codec.GatewayBeat{Gateway: "gw-1", Seq: 3, IntervalMS: 1000},
		"job-submit":   &codec.JobSubmit{Job: "j1", Op: "tag", Items: []string{"/a.png", "/b.png"}, Options: &codec.Request{TimeoutMS: 1000}},
	}
}

// smallOpts keep the unit tests fast: shallow nesting and small huge bodies.
var smallOpts = Options{Seed: 1, MaxBody: 256 << 10, Depth: 1000,
	Forge: map[string][]string{"worker": {"other-worker"}, "pool": {"other-pool"}, "id": {"someone-elses-id"},
		"gateway": {"other-gw"}, "class": {"urgent"}, "model": {"other-model"}, "job": {"someone-elses-job"}},
	Paths: []string{"/srv/img/../../etc/passwd", "/srv/img/link-out/x.png"}}

func digest(ms []Mutation) [32]byte {
	h := sha256.New()
	for _, m := range ms {
		fmt.Fprintf(h, "%s|%v|%d|", m.Name, m.JSON, len(m.Body))
		h.Write(m.Body)
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

func TestDeterministic(t *testing.T) {
	all := samples()
	for _, name := range []string{"request-tag", "heartbeat", "cancel"} {
		s := all[name]
		a, err := Generate(s, smallOpts)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, err := Generate(s, smallOpts)
		if err != nil {
			t.Fatal(err)
		}
		if digest(a) != digest(b) {
			t.Errorf("%s: two runs with seed %d differ", name, smallOpts.Seed)
		}
		o := smallOpts
		o.Seed = 2
		c, err := Generate(s, o)
		if err != nil {
			t.Fatal(err)
		}
		if digest(a) == digest(c) {
			t.Errorf("%s: seeds 1 and 2 give the same stream (the random section ignores the seed)", name)
		}
	}
}

func TestCountsAndCategories(t *testing.T) {
	const minDistinct = 300
	for name, s := range samples() {
		ms, err := Generate(s, smallOpts)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		names := map[string]bool{}
		bodies := map[string]bool{}
		cats := map[Category]int{}
		for _, m := range ms {
			if names[m.Name] {
				t.Errorf("%s: mutation name %q twice", name, m.Name)
			}
			names[m.Name] = true
			bodies[fmt.Sprintf("%v|%x", m.JSON, sha256.Sum256(m.Body))] = true
			cats[m.Category]++
			if !strings.HasPrefix(m.Name, string(m.Category)+"/") {
				t.Errorf("%s: mutation %q is not named after its category %s", name, m.Name, m.Category)
			}
			if len(m.Body) > smallOpts.MaxBody {
				t.Errorf("%s: %s is %d bytes, over MaxBody %d", name, m.Name, len(m.Body), smallOpts.MaxBody)
			}
		}
		if len(bodies) < minDistinct {
			t.Errorf("%s: %d distinct bodies, want > %d", name, len(bodies), minDistinct)
		}
		want := slices.Clone(Categories)
		if !strings.HasPrefix(name, "request-") && name != "workitem" {
			want = slices.DeleteFunc(want, func(c Category) bool { return c == CatPath })
		}
		if name == "request-compare" || name == "request-infer" {
			want = slices.DeleteFunc(want, func(c Category) bool { return c == CatPath }) // no path field
		}
		for _, c := range want {
			if cats[c] == 0 {
				t.Errorf("%s: no mutation of category %s", name, c)
			}
		}
		t.Logf("%s: %d mutations, %d distinct bodies; %v", name, len(ms), len(bodies), cats)
	}
}

// TestPresent checks the specific mutations the issue names, on a request.
func TestPresent(t *testing.T) {
	ms, err := Generate(samples()["request-tag"], smallOpts)
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]Mutation{}
	for _, m := range ms {
		by[m.Name] = m
	}
	need := map[string][]byte{
		"length/array32/max/alone":        {0xdd, 0xff, 0xff, 0xff, 0xff},
		"length/str32/max/alone":          {0xdb, 0xff, 0xff, 0xff, 0xff},
		"length/map32/max/alone":          {0xdf, 0xff, 0xff, 0xff, 0xff},
		"length/ext32/max/alone":          {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01},
		"length/bin32/max/alone":          {0xc6, 0xff, 0xff, 0xff, 0xff},
		"length/fixext16/nopayload/alone": {0xd8, 0x01},
	}
	for name, prefix := range need {
		m, ok := by[name]
		if !ok {
			t.Errorf("no mutation %s", name)
			continue
		}
		if !bytes.HasPrefix(m.Body, prefix) {
			t.Errorf("%s: body % x, want it to start % x", name, m.Body[:min(len(m.Body), 8)], prefix)
		}
	}
	for _, name := range []string{
		"length/array32/max@class", "length/str8/max@path", "length/map16/max-1@thresholds", "length/bin16/half@path",
		"utf8/ff@class", "utf8/c3-28@path", "utf8/overlong-slash@id", "utf8/nul-inside@model", "utf8/lone-udfff@class+json",
		"type/timestamp32@timeout_ms", "type/map@path", "type/nil@class", "type/true@id", "type/ext8@model",
		"number/int64-min@timeout_ms", "number/uint64-max@timeout_ms", "number/nan@thresholds.general", "number/plus-inf@thresholds.general",
		"number/minus-inf@timeout_ms", "number/1e308@timeout_ms", "number/minus-1@timeout_ms", "number/1e309@timeout_ms+json",
		"identity/dot@id", "identity/star@class", "identity/gt@model", "identity/space@id", "identity/ctrl-01@id", "identity/10kb@id",
		"path/12-_nul__png@path", "path/2-____________etc_passwd@path", "path/0-relative_png@path", "path/19-_srv_img_______etc_passw~25b@path",
		"nesting/fixarray-1000", "nesting/fixmap-1000", "nesting/array-1000+json", "nesting/object-1000+json", "nesting/array-1000@path",
		"empty/zero-bytes", "empty/zero-bytes+json", "content_type/json-body-as-msgpack", "content_type/msgpack-body-as-json+json",
		"dupkey/valid-then-ff@class", "dupkey/valid-then-udfff@class+json", "unknown/zzz", "unknown/int-key", "unknown/zzz+json",
		"truncate/0", "truncate/1", "missing/field@path", "huge/pad-string-262144", "huge/pad-string-262144+json",
	} {
		if _, ok := by[name]; !ok {
			var near []string
			for n := range by {
				if strings.HasPrefix(n, strings.SplitN(name, "@", 2)[0]) {
					near = append(near, n)
				}
			}
			slices.Sort(near)
			t.Errorf("no mutation %s (near: %v)", name, near[:min(len(near), 8)])
		}
	}
	// The lying header in place of a field's value keeps the rest of the message after it.
	m := by["length/array32/max@class"]
	if !bytes.Contains(m.Body, []byte{0xa5, 'c', 'l', 'a', 's', 's', 0xdd, 0xff, 0xff, 0xff, 0xff}) {
		t.Errorf("length/array32/max@class: % x", m.Body)
	}
	// Invalid UTF-8 reaches the wire unchanged.
	if m := by["utf8/ff@class"]; !bytes.Contains(m.Body, []byte{0xa5, 'c', 'l', 'a', 's', 's', 0xa1, 0xff}) {
		t.Errorf("utf8/ff@class: % x", m.Body)
	}
	if m := by["utf8/lone-udfff@class+json"]; !m.JSON || !bytes.Contains(m.Body, []byte(`"class":"\udfff"`)) {
		t.Errorf("utf8/lone-udfff@class+json: %s", m.Body)
	}
}

// TestHugeAndDeep checks the default sizes: nesting 1e5 deep and bodies up to MaxBody.
func TestHugeAndDeep(t *testing.T) {
	g, err := New(&codec.Cancel{ID: "x"}, Options{MaxBody: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	largest := 0
	for m := range g.All() {
		switch m.Name {
		case "nesting/fixarray-100000":
			if len(m.Body) != 100001 || m.Body[0] != 0x91 {
				t.Errorf("%s: %d bytes", m.Name, len(m.Body))
			}
		case "nesting/object-100000+json":
			var v any
			if json.Unmarshal(m.Body, &v) == nil {
				t.Errorf("%s decodes with encoding/json (it should exceed its depth limit)", m.Name)
			}
		}
		if m.Category == CatHuge {
			largest = max(largest, len(m.Body))
		}
	}
	if largest < 1<<20-1024 || largest > 1<<20 {
		t.Errorf("largest huge body %d bytes, want just under 1 MiB", largest)
	}
}

// TestValidSamplesDecode checks that the generator's starting points are valid (the
// mutations are only hostile relative to them).
func TestValidSamplesDecode(t *testing.T) {
	g, err := New(MsgpackBytes([]byte{0x81, 0xa2, 'i', 'd', 0xa1, 'x'}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	mp, js := g.Valid()
	var c codec.Cancel
	if err := codec.Decode(mp, &c, false); err != nil || c.ID != "x" {
		t.Errorf("msgpack sample: %v %+v", err, c)
	}
	if err := codec.Decode(js, &c, true); err != nil || c.ID != "x" {
		t.Errorf("JSON of the msgpack sample %s: %v %+v", js, err, c)
	}
	if _, err := New(JSONBytes(`{"id":"y","class":"batch"}`), Options{}); err != nil {
		t.Errorf("JSON sample: %v", err)
	}
	if _, err := New([]byte{0x91, 0x01}, Options{}); err == nil {
		t.Errorf("an array sample was accepted")
	}
	// Early stop of the stream.
	n := 0
	for range g.All() {
		n++
		if n == 5 {
			break
		}
	}
	if n != 5 {
		t.Errorf("stopped after %d", n)
	}
}

// TestManyKeysDistinct checks the huge map of unknown keys: valid msgpack, distinct keys.
func TestManyKeysDistinct(t *testing.T) {
	g, err := New(&codec.Cancel{ID: "x"}, Options{MaxBody: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	for m := range g.All() {
		if m.Name != "huge/many-keys-65536" {
			continue
		}
		var v map[string]any
		if err := codec.Unmarshal(m.Body, &v); err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		if len(v) < 6000 || v["id"] != "x" {
			t.Errorf("%s: %d keys, id %v", m.Name, len(v), v["id"])
		}
		return
	}
	t.Error("no huge/many-keys-65536")
}

// TestSelectIsAllFiltered checks Select against All: keep is asked about every mutation
// of All's stream, in order, with its index, name and category, and the mutations it
// keeps come out with All's names, fields and bodies (the huge and deep ones included,
// whose bodies Select builds only when kept).
func TestSelectIsAllFiltered(t *testing.T) {
	g, err := New(samples()["request-tag"], smallOpts)
	if err != nil {
		t.Fatal(err)
	}
	all := slices.Collect(g.All())
	kept := func(i int, cat Category) bool { return i%7 == 0 || cat == CatHuge || cat == CatNesting }
	var want []Mutation
	for i, m := range all {
		if kept(i, m.Category) {
			want = append(want, m)
		}
	}
	asked := 0
	got := slices.Collect(g.Select(func(i int, name string, cat Category) bool {
		if i != asked || i >= len(all) || all[i].Name != name || all[i].Category != cat {
			t.Fatalf("keep asked about #%d %s (%s) after %d questions", i, name, cat, asked)
		}
		asked++
		return kept(i, cat)
	}))
	if asked != len(all) {
		t.Errorf("keep was asked %d times, All yields %d", asked, len(all))
	}
	if len(got) != len(want) || digest(got) != digest(want) {
		t.Errorf("Select kept %d mutations, All filtered %d; or their bodies differ", len(got), len(want))
	}
	for i := range min(len(got), len(want)) {
		if got[i].Field != want[i].Field || got[i].JSON != want[i].JSON {
			t.Errorf("#%d %s: field %q json %v, All has %q %v", i, got[i].Name, got[i].Field, got[i].JSON, want[i].Field, want[i].JSON)
		}
	}
	// Stopping early stops the stream.
	n := 0
	for range g.Select(func(int, string, Category) bool { return true }) {
		if n++; n == 3 {
			break
		}
	}
	if n != 3 {
		t.Errorf("stopped after %d", n)
	}
}
