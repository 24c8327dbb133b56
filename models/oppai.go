package models

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/ort"
)

// oppai serves tag for OppaiOracle-style taggers (kind tagger-oppai, OppaiOracle v1.1).
//
// Preprocessing: alpha over white, fitted into the input size (448) without upscaling
// (libvips's thumbnail: shrink on load, then Lanczos3; a BMP, decoded by Go, with the
// triangle filter), letterboxed centred on (114,114,114), RGB, NCHW, (x/255-0.5)/0.5 into "pixel_values"; when the model
// has a "padding_mask" input (bool [N,H,W]) it gets true on the letterbox bars.
//
// Output "tag_logits" [N,K] holds probabilities already (the export applies the sigmoid).
// vocabulary.json maps names to columns ({"tag_to_index": {name: index}}); `<PAD>` and
// `<UNK>` are skipped. A tag is kept when its score reaches its threshold: the request's
// thresholds.general (thresholds.character for character tags) if set, else the tag's
// own entry in pr_thresholds.json ({"thresholds": {name: value}}; a file without that
// object, such as the real model's file of global P=R statistics, gives none), else the
// model's general_threshold, else 0.760.
//
// Reply: kept tags in General; every `rating:*` entry, kept or not, in Rating keyed by
// the name WITHOUT the "rating:" prefix (general, sensitive, questionable, explicit), as
// the other tagger kinds key it; clients that want the app's "rating:general" form add
// the prefix back. OppaiOracle has no tag categories, so Character stays empty unless
// vocabulary.json carries an optional "tag_to_category" object ({name: "character"} or
// the selected_tags.csv code 4), whose character tags then go to Character (general
// categories and anything else stay in General). IPs are always empty.
type oppai struct {
	base
	sess       *ort.Session
	input      string // pixel_values
	mask       string // padding_mask, or "" when the model has no such input
	output     string // tag_logits, or the first output
	size       int
	tags       []oppaiTag // by output column
	thresholds map[string]float32
	general    float32
	character  float32
}

// oppaiFallback is OppaiOracle's threshold for a tag without its own.
const oppaiFallback = 0.760

// oppaiRatingPrefix starts the names of OppaiOracle's rating entries.
const oppaiRatingPrefix = "rating:"

// Roles of vocabulary entries.
const (
	oppaiSkip      = iota // <PAD>, <UNK>, or a column without a name
	oppaiGeneral          // a plain tag
	oppaiCharacter        // a character tag (only with tag_to_category)
	oppaiRating           // rating:*, always returned
)

type oppaiTag struct {
	name string // the reply key (without "rating:" for ratings)
	full string // the vocabulary name (the key for pr_thresholds.json)
	role int
}

func openOppai(env Env, m *config.Model, dir string) (Model, error) {
	o := &oppai{base: newBase(env, m)}
	mp, err := mustFile(m, dir, "model")
	if err != nil {
		return nil, err
	}
	vp, err := mustFile(m, dir, "vocabulary")
	if err != nil {
		return nil, err
	}
	if o.tags, err = readOppaiVocabulary(vp); err != nil {
		return nil, codec.Errorf(codec.CodeUnknownModel, "model %s: %v", m.Name, err).With("model", m.Name)
	}
	if p, ok := file(m, dir, "thresholds"); ok {
		if o.thresholds, err = readOppaiThresholds(p); err != nil {
			return nil, codec.Errorf(codec.CodeUnknownModel, "model %s: %v", m.Name, err).With("model", m.Name)
		}
	}
	o.general, o.character = oppaiFallback, oppaiFallback
	if m.General > 0 {
		o.general = float32(m.General)
	}
	if m.Character > 0 {
		o.character = float32(m.Character)
	}
	if o.sess, err = o.session(mp); err != nil {
		return nil, err
	}
	in, ok := o.sess.Input("pixel_values")
	if !ok {
		in, _ = o.sess.Input("")
	}
	o.input = in.Name
	o.size = dimOr(in.Shape, 2, 448)
	if mk, ok := o.sess.Input("padding_mask"); ok {
		if mk.Type != "bool" {
			o.Close()
			return nil, codec.Errorf(codec.CodeUnknownModel, "model %s: padding_mask is %s, want bool", m.Name, mk.Type).With("model", m.Name)
		}
		o.mask = mk.Name
	}
	if len(o.sess.Inputs) > 2 || (len(o.sess.Inputs) == 2 && o.mask == "") {
		o.Close()
		return nil, codec.Errorf(codec.CodeUnknownModel, "model %s: unexpected inputs %v (want pixel_values and an optional padding_mask)",
			m.Name, oppaiInputNames(o.sess.Inputs)).With("model", m.Name)
	}
	o.output = o.sess.Outputs[0].Name
	for _, out := range o.sess.Outputs {
		if out.Name == "tag_logits" {
			o.output = out.Name
		}
	}
	return o, nil
}

func oppaiInputNames(infos []ort.IOInfo) []string {
	out := make([]string, len(infos))
	for i, in := range infos {
		out[i] = in.Name
	}
	return out
}

// readOppaiVocabulary reads vocabulary.json into a column-indexed table.
func readOppaiVocabulary(path string) ([]oppaiTag, error) {
	var v struct {
		TagToIndex    map[string]int             `json:"tag_to_index"`
		TagToCategory map[string]json.RawMessage `json:"tag_to_category"`
	}
	if err := readJSON(path, &v); err != nil {
		return nil, err
	}
	if len(v.TagToIndex) == 0 {
		return nil, fmt.Errorf("%s: no tag_to_index entries", path)
	}
	n := 0
	for name, i := range v.TagToIndex {
		if i < 0 {
			return nil, fmt.Errorf("%s: tag %q has index %d", path, name, i)
		}
		n = max(n, i+1)
	}
	if n > 10*len(v.TagToIndex)+16 {
		return nil, fmt.Errorf("%s: indices up to %d for %d tags", path, n-1, len(v.TagToIndex))
	}
	tags := make([]oppaiTag, n)
	for name, i := range v.TagToIndex {
		if tags[i].full != "" {
			return nil, fmt.Errorf("%s: index %d is both %q and %q", path, i, tags[i].full, name)
		}
		t := oppaiTag{name: name, full: name, role: oppaiGeneral}
		switch {
		case name == "<PAD>" || name == "<UNK>" || name == "":
			t.role = oppaiSkip
		case strings.HasPrefix(name, oppaiRatingPrefix):
			t.role, t.name = oppaiRating, strings.TrimPrefix(name, oppaiRatingPrefix)
		case isCharacterCategory(v.TagToCategory[name]):
			t.role = oppaiCharacter
		}
		tags[i] = t
	}
	return tags, nil
}

// isCharacterCategory reports whether a tag_to_category value names the character
// category: "character" or selected_tags.csv's code 4.
func isCharacterCategory(raw json.RawMessage) bool {
	if len(raw) == 0 {
		return false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return strings.EqualFold(s, "character")
	}
	var n float64
	return json.Unmarshal(raw, &n) == nil && n == CatCharacter
}

// readOppaiThresholds reads the per-tag thresholds of pr_thresholds.json: the numbers of
// its "thresholds" object. Other content (the real file's global statistics) is ignored.
func readOppaiThresholds(path string) (map[string]float32, error) {
	var v map[string]json.RawMessage
	if err := readJSON(path, &v); err != nil {
		return nil, err
	}
	var per map[string]json.RawMessage
	if raw, ok := v["thresholds"]; !ok || json.Unmarshal(raw, &per) != nil {
		return nil, nil
	}
	out := make(map[string]float32, len(per))
	for name, raw := range per {
		var f float64
		if json.Unmarshal(raw, &f) == nil {
			out[name] = float32(f)
		}
	}
	return out, nil
}

type oppaiItem struct {
	pixels     []float32
	mask       []bool // nil when the model takes no mask
	thresholds *codec.Thresholds
}

func (o *oppai) Prepare(op string, req *codec.WorkItem) (Item, error) {
	if err := o.checkOp(op); err != nil {
		return nil, err
	}
	img, _, err := o.image(req, images.LoadSpec{Width: o.size, Height: o.size, Fill: images.FillFitDown, Background: images.WhiteRGBA})
	if err != nil {
		return nil, err
	}
	lb, li := images.Letterbox(images.FlattenOn(img, images.White), o.size, images.LetterboxGray, false)
	it := &oppaiItem{pixels: make([]float32, 3*o.size*o.size), thresholds: req.Thresholds}
	images.ToCHW(lb, it.pixels, images.HalfMean, images.HalfStd, images.Scale255, false)
	if o.mask != "" {
		it.mask = make([]bool, o.size*o.size)
		li.PaddingMask(it.mask)
	}
	return it, nil
}

func (o *oppai) Run(ctx context.Context, op string, items []Item) ([]codec.Replier, []error) {
	px := make([][]float32, len(items))
	for i, it := range items {
		px[i] = it.(*oppaiItem).pixels
	}
	sz := int64(o.size)
	in := stack(px, []int64{3, sz, sz})
	in.Name = o.input
	inputs := []ort.Tensor{in}
	if o.mask != "" {
		mask := make([]bool, 0, len(items)*o.size*o.size)
		for _, it := range items {
			mask = append(mask, it.(*oppaiItem).mask...)
		}
		inputs = append(inputs, ort.Tensor{Name: o.mask, Shape: []int64{int64(len(items)), sz, sz}, Data: mask})
	}
	outs, err := o.sess.Run(ctx, inputs)
	if err != nil {
		return fail(len(items), err)
	}
	var probs []float32
	for _, out := range outs {
		if out.Name == o.output {
			probs = out.Float32()
		}
	}
	if probs == nil || len(probs)%len(items) != 0 {
		return fail(len(items), codec.Errorf(codec.CodeInternal, "model %s: output %s is not a float32 [N,K] tensor", o.name, o.output))
	}
	k := len(probs) / len(items)
	if k != len(o.tags) {
		return fail(len(items), codec.Errorf(codec.CodeInternal, "model %s outputs %d scores but its vocabulary has %d entries", o.name, k, len(o.tags)))
	}
	replies := make([]codec.Replier, len(items))
	for i, it := range items {
		replies[i] = o.decode(probs[i*k:(i+1)*k], it.(*oppaiItem).thresholds)
	}
	return replies, make([]error, len(items))
}

// threshold is the score tag must reach (see the type's comment for the order).
func (o *oppai) threshold(tag oppaiTag, over *codec.Thresholds) float32 {
	if over != nil {
		if tag.role == oppaiCharacter && over.Character != nil {
			return float32(*over.Character)
		}
		if tag.role != oppaiCharacter && over.General != nil {
			return float32(*over.General)
		}
	}
	if v, ok := o.thresholds[tag.full]; ok {
		return v
	}
	if tag.role == oppaiCharacter {
		return o.character
	}
	return o.general
}

// decode turns one row of probabilities into the tag reply.
func (o *oppai) decode(p []float32, over *codec.Thresholds) *codec.TagReply {
	r := &codec.TagReply{General: map[string]float32{}, Character: map[string]float32{}, Rating: map[string]float32{},
		IPs: []string{}, IPsMapping: map[string][]string{}}
	for i, tag := range o.tags {
		s := p[i]
		switch tag.role {
		case oppaiSkip:
		case oppaiRating:
			r.Rating[tag.name] = s
		case oppaiCharacter:
			if s >= o.threshold(tag, over) {
				r.Character[tag.name] = s
			}
		default:
			if s >= o.threshold(tag, over) {
				r.General[tag.name] = s
			}
		}
	}
	return r
}
