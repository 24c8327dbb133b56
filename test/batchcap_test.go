package test

import (
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
	"github.com/ortbus/ortbus/models/onnxgen"
)

// TestDetectorFixedBatchOnBatchingPool: the generated detector's input is [1,3,640,640],
// a batch dimension fixed at 1 as real YOLOv8 exports have. On a pool with max_batch 8 a
// burst of concurrent batch-class detect requests is answered one runtime call per item —
// each one right (its box), none internal ("Got invalid dimensions for input") — and
// ortbus_requests_total counts them, and a batch tag and a segment that name no model,
// under the model that served them, not an empty model label.
func TestDetectorFixedBatchOnBatchingPool(t *testing.T) {
	root := imageRoot(t)
	md := testenv.Models(t)
	cfg := gwConfig{
		Root: root,
		Models: map[string]*config.Model{
			gwTagger:    {Kind: config.KindTaggerPixAI, Dir: filepath.Join(md, onnxgen.TaggerDir)},
			"detector":  {Kind: config.KindDetect, Dir: filepath.Join(md, onnxgen.DetectorDir)},
			"segmenter": {Kind: config.KindSegment, Dir: filepath.Join(md, onnxgen.SegmenterDir)},
		},
		Pools: []gwPool{
			{Name: "bt", Version: "1.30.0", Workers: 1, Slots: 1, Classes: []string{"batch"}, Models: []string{"detector", gwTagger}, MaxBatch: 8},
			{Name: "ia", Version: "1.30.0", Workers: 1, Slots: 1, Classes: []string{"interactive"}, Models: []string{"segmenter"}},
		},
		Classes: []gwClass{
			{Name: "interactive", Chain: []string{"ia"}, QueueBound: 64},
			{Name: "batch", Chain: []string{"bt"}, QueueBound: 256},
		},
	}
	g := startGateway(t, cfg.write(t))
	g.waitLive(t, "bt", 1)
	g.waitLive(t, "ia", 1)

	const w, h, x1, y1, x2, y2 = 400, 300, 100, 80, 250, 200
	rect := writePNG(t, root, "rect.png", w, h, onnxgen.Rect(onnxgen.ColourNames["white"], onnxgen.ColourNames["red"], x1, y1, x2, y2))
	before := gwParseRequestCounts(t, gwScrape(t, g.Ready.HTTP)) // nothing counted yet

	const burst = 48
	in := newInbox(t, g.NC)
	for i := range burst {
		key := fmt.Sprintf("d%02d", i)
		g.post(t, in, "detect", key, &codec.Request{ID: key, Path: rect, Class: "batch"})
	}
	_, got := gwCollect(t, in, burst)
	for k, r := range got {
		if r.Err != nil {
			t.Errorf("%s: %s: %s", k, r.Err.Code, r.Err.Message)
			continue
		}
		var d codec.DetectReply
		if err := codec.Unmarshal(r.Msg.Data, &d); err != nil {
			t.Fatalf("%s: decode: %v", k, err)
		}
		if d.Model != "detector" || d.Timing.Batch > 1 {
			t.Errorf("%s: served by %q in a batch of %d, want the detector alone", k, d.Model, d.Timing.Batch)
		}
		if len(d.Boxes) != 1 {
			t.Errorf("%s: boxes %+v, want one", k, d.Boxes)
			continue
		}
		b := d.Boxes[0]
		for _, c := range []struct {
			name      string
			got, want float32
		}{{"x1", b.X1, x1}, {"y1", b.Y1, y1}, {"x2", b.X2, x2}, {"y2", b.Y2, y2}} {
			if math.Abs(float64(c.got-c.want)) > 3 {
				t.Errorf("%s: box %s = %v, want %v within 3 px", k, c.name, c.got, c.want)
			}
		}
	}

	// A batch tag and an interactive segment that name no model.
	if r := g.call(t, "tag", &codec.Request{Path: rect, Class: "batch"}, gwReplyBound); r.Err != nil {
		t.Errorf("batch tag: %s: %s", r.Err.Code, r.Err.Message)
	}
	if r := g.call(t, "segment", &codec.Request{Path: rect}, gwReplyBound); r.Err != nil {
		t.Errorf("segment: %s: %s", r.Err.Code, r.Err.Message)
	}
	// A worker answers a client straight and tells the gateway a hop later: counted once
	// the gateway has heard of every answer (nothing in flight).
	gwSettle(t, g)
	after := gwRequestCounts(t, g.Ready.HTTP)
	for k, want := range map[string]float64{
		gwMetricKey("detect", "batch", "bt", "detector", "ok"):         burst,
		gwMetricKey("tag", "batch", "bt", gwTagger, "ok"):              1,
		gwMetricKey("segment", "interactive", "ia", "segmenter", "ok"): 1,
	} {
		if d := after[k] - before[k]; d != want {
			t.Errorf("ortbus_requests_total{%s} grew by %v, want %v", k, d, want)
		}
	}
	for _, k := range []string{gwMetricKey("detect", "batch", "bt", "", "ok"), gwMetricKey("tag", "batch", "bt", "", "ok"), gwMetricKey("segment", "interactive", "ia", "", "ok")} {
		if n := after[k]; n != 0 {
			t.Errorf("ortbus_requests_total{%s} = %v: counted under an empty model label", k, n)
		}
	}
}
