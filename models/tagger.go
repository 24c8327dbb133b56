package models

import (
	"context"
	"image/color"
	"sort"

	"golang.org/x/image/draw"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/ort"
)

// tagger serves tag for PixAI-style and WD14-style taggers.
//
// PixAI (the app's default): alpha over white, exact resize to the input size (libvips's
// thumbnail: shrink on load, then Lanczos3), RGB, NCHW, (x/255-0.5)/0.5; per-tag
// thresholds from thresholds.csv with a fallback; characters carry IPs.
// WD14: alpha over white, fitted into the input size (libvips: shrink on load, then
// Lanczos3), padded to a white square, BGR, NHWC, values 0-255; fixed thresholds per
// category. (A BMP, decoded by Go, is resized with CatmullRom for WD14 and the triangle
// filter for PixAI, as before libvips.)
type tagger struct {
	base
	sess       *ort.Session
	input      string
	size       int
	nhwc       bool
	tags       []Tag
	thresholds map[string]float32
	general    float32
	character  float32
}

func openTagger(env Env, m *config.Model, dir string) (Model, error) {
	t := &tagger{base: newBase(env, m)}
	mp, err := mustFile(m, dir, "model")
	if err != nil {
		return nil, err
	}
	tp, err := mustFile(m, dir, "tags")
	if err != nil {
		return nil, err
	}
	if t.tags, err = readTags(tp); err != nil {
		return nil, err
	}
	if p, ok := file(m, dir, "thresholds"); ok {
		if t.thresholds, err = readThresholds(p); err != nil {
			return nil, err
		}
	}
	t.general, t.character = 0.4, 0.4 // PixAI's fallback
	if m.Kind == config.KindTaggerWD14 {
		t.general, t.character, t.nhwc = 0.35, 0.85, true
	}
	if m.General > 0 {
		t.general = float32(m.General)
	}
	if m.Character > 0 {
		t.character = float32(m.Character)
	}
	if t.sess, err = t.session(mp); err != nil {
		return nil, err
	}
	in, _ := t.sess.Input("")
	t.input = in.Name
	if t.nhwc {
		t.size = dimOr(in.Shape, 1, 448)
	} else {
		t.size = dimOr(in.Shape, 2, 448)
	}
	return t, nil
}

type tagItem struct {
	pixels     []float32
	thresholds *codec.Thresholds
}

func (t *tagger) Prepare(op string, req *codec.WorkItem) (Item, error) {
	if err := t.checkOp(op); err != nil {
		return nil, err
	}
	spec := images.LoadSpec{Width: t.size, Height: t.size, Fill: images.FillForce, Background: images.WhiteRGBA}
	if t.nhwc {
		spec.Fill = images.FillFit
	}
	img, _, err := t.image(req, spec)
	if err != nil {
		return nil, err
	}
	px := make([]float32, 3*t.size*t.size)
	if t.nhwc {
		sq := images.PadSquare(images.FlattenOn(img, color.White), color.White)
		images.ToHWC(images.Resize(sq, t.size, t.size, draw.CatmullRom), px, images.ZeroMean, images.UnitStd, 1, true)
	} else {
		rgb := images.Resize(images.FlattenOn(img, color.White), t.size, t.size, draw.BiLinear)
		images.ToCHW(rgb, px, images.HalfMean, images.HalfStd, images.Scale255, false)
	}
	return &tagItem{pixels: px, thresholds: req.Thresholds}, nil
}

func (t *tagger) Run(ctx context.Context, op string, items []Item) ([]codec.Replier, []error) {
	px := make([][]float32, len(items))
	for i, it := range items {
		px[i] = it.(*tagItem).pixels
	}
	shape := []int64{3, int64(t.size), int64(t.size)}
	if t.nhwc {
		shape = []int64{int64(t.size), int64(t.size), 3}
	}
	in := stack(px, shape)
	in.Name = t.input
	outs, err := t.sess.Run(ctx, []ort.Tensor{in})
	if err != nil {
		return fail(len(items), err)
	}
	probs := outs[0].Float32()
	k := len(probs) / len(items)
	if k != len(t.tags) {
		return fail(len(items), codec.Errorf(codec.CodeInternal, "model %s outputs %d scores but its label file has %d tags", t.name, k, len(t.tags)))
	}
	replies := make([]codec.Replier, len(items))
	for i, it := range items {
		replies[i] = t.decode(probs[i*k:(i+1)*k], it.(*tagItem).thresholds)
	}
	return replies, make([]error, len(items))
}

// threshold is the score a tag must reach: the request's threshold for its category if
// it set one, else the tag's own threshold from the model's file, else the model's
// default for the category.
func (t *tagger) threshold(tag Tag, over *codec.Thresholds) float32 {
	if over != nil {
		if tag.Category == CatCharacter && over.Character != nil {
			return float32(*over.Character)
		}
		if tag.Category != CatCharacter && over.General != nil {
			return float32(*over.General)
		}
	}
	if v, ok := t.thresholds[tag.Name]; ok {
		return v
	}
	if tag.Category == CatCharacter {
		return t.character
	}
	return t.general
}

// decode turns one row of probabilities into the tag reply.
func (t *tagger) decode(p []float32, over *codec.Thresholds) *codec.TagReply {
	r := &codec.TagReply{General: map[string]float32{}, Character: map[string]float32{}, Rating: map[string]float32{},
		IPs: []string{}, IPsMapping: map[string][]string{}}
	ipCount := map[string]int{}
	for i, tag := range t.tags {
		s := p[i]
		th := t.threshold(tag, over)
		switch tag.Category {
		case CatRating:
			r.Rating[tag.Name] = s
		case CatCharacter:
			if s >= th {
				r.Character[tag.Name] = s
				if len(tag.IPs) > 0 {
					r.IPsMapping[tag.Name] = tag.IPs
					for _, ip := range tag.IPs {
						ipCount[ip]++
					}
				}
			}
		default:
			if s >= th {
				r.General[tag.Name] = s
			}
		}
	}
	for ip := range ipCount {
		r.IPs = append(r.IPs, ip)
	}
	// IPs by how many detected characters name them, then by name.
	sort.Slice(r.IPs, func(a, b int) bool {
		ca, cb := ipCount[r.IPs[a]], ipCount[r.IPs[b]]
		if ca != cb {
			return ca > cb
		}
		return r.IPs[a] < r.IPs[b]
	})
	return r
}
