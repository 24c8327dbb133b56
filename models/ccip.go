package models

import (
	"context"
	"fmt"
	"image/color"

	"golang.org/x/image/draw"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/ort"
)

// ccip serves embed (the CCIP character feature of an image) and compare (differences of
// one feature to N candidates, from the metrics model, in one run over [1+N, dim]).
//
// Preprocessing: alpha over white, exact resize to 384 (libvips's thumbnail: shrink on
// load, then Lanczos3; a BMP, decoded by Go, with the triangle filter), x/255, CLIP
// mean/std, RGB NCHW.
type ccip struct {
	base
	feat, metrics *ort.Session
	featIn        string
	metricsIn     string
	size, dim     int
	threshold     float64
}

func openCCIP(env Env, m *config.Model, dir string) (Model, error) {
	c := &ccip{base: newBase(env, m)}
	fp, err := mustFile(m, dir, "model")
	if err != nil {
		return nil, err
	}
	if c.feat, err = c.session(fp); err != nil {
		return nil, err
	}
	in, _ := c.feat.Input("")
	c.featIn, c.size = in.Name, dimOr(in.Shape, 2, 384)
	c.dim = dimOr(c.feat.Outputs[0].Shape, 1, 768)
	if mp, ok := file(m, dir, "metrics"); ok {
		if c.metrics, err = c.session(mp); err != nil {
			return nil, err
		}
		min, _ := c.metrics.Input("")
		c.metricsIn = min.Name
	}
	c.threshold = 0.17847511429108218
	if jp, ok := file(m, dir, "metrics_json"); ok {
		var mj struct {
			Threshold *float64 `json:"threshold"`
		}
		if err := readJSON(jp, &mj); err != nil {
			return nil, err
		}
		if mj.Threshold != nil {
			c.threshold = *mj.Threshold
		}
	}
	return c, nil
}

type compareItem struct{ rows [][]float32 }

func (c *ccip) Prepare(op string, req *codec.WorkItem) (Item, error) {
	if err := c.checkOp(op); err != nil {
		return nil, err
	}
	if op == "compare" {
		if c.metrics == nil {
			return nil, codec.Errorf(codec.CodeUnknownOp, "model %s has no metrics model, so it cannot compare", c.name)
		}
		if len(req.Candidates) == 0 {
			return nil, codec.Errorf(codec.CodeBadRequest, "compare needs candidates (one or more feature vectors)")
		}
		rows := [][]float32{req.Feature}
		for _, cand := range req.Candidates {
			rows = append(rows, cand)
		}
		for i, r := range rows {
			if len(r) != c.dim {
				what := "feature"
				if i > 0 {
					what = fmt.Sprintf("candidate %d", i-1)
				}
				return nil, codec.Errorf(codec.CodeBadRequest, "%s has %d values, the model's features have %d", what, len(r), c.dim)
			}
		}
		return &compareItem{rows: rows}, nil
	}
	img, _, err := c.image(req, images.LoadSpec{Width: c.size, Height: c.size, Fill: images.FillForce, Background: images.WhiteRGBA})
	if err != nil {
		return nil, err
	}
	px := make([]float32, 3*c.size*c.size)
	images.ToCHW(images.Resize(images.FlattenOn(img, color.White), c.size, c.size, draw.BiLinear), px, images.ClipMean, images.ClipStd, images.Scale255, false)
	return px, nil
}

func (c *ccip) Run(ctx context.Context, op string, items []Item) ([]codec.Replier, []error) {
	if op == "compare" {
		replies := make([]codec.Replier, len(items))
		errs := make([]error, len(items))
		for i, it := range items {
			replies[i], errs[i] = c.compare(ctx, it.(*compareItem))
		}
		return replies, errs
	}
	px := make([][]float32, len(items))
	for i, it := range items {
		px[i] = it.([]float32)
	}
	in := stack(px, []int64{3, int64(c.size), int64(c.size)})
	in.Name = c.featIn
	outs, err := c.feat.Run(ctx, []ort.Tensor{in})
	if err != nil {
		return fail(len(items), err)
	}
	feat := outs[0].Float32()
	replies := make([]codec.Replier, len(items))
	for i := range items {
		v := append(codec.FloatVec(nil), feat[i*c.dim:(i+1)*c.dim]...)
		replies[i] = &codec.EmbedReply{Dim: c.dim, Embedding: v}
	}
	return replies, make([]error, len(items))
}

// compare runs the metrics model once over [feature; candidates] and reads row 0.
func (c *ccip) compare(ctx context.Context, it *compareItem) (codec.Replier, error) {
	in := stack(it.rows, []int64{int64(c.dim)})
	in.Name = c.metricsIn
	outs, err := c.metrics.Run(ctx, []ort.Tensor{in})
	if err != nil {
		return nil, err
	}
	d := outs[0].Float32()
	n := len(it.rows)
	if len(d) != n*n {
		return nil, codec.Errorf(codec.CodeInternal, "metrics model returned %d values for %d rows", len(d), n)
	}
	r := &codec.CompareReply{Threshold: c.threshold, Differences: make([]float32, n-1), Same: make([]bool, n-1)}
	for j := 1; j < n; j++ {
		r.Differences[j-1] = d[j]
		r.Same[j-1] = float64(d[j]) <= c.threshold
	}
	return r, nil
}
