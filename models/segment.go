package models

import (
	"context"
	"fmt"
	"image"
	"image/color"
	"os"
	"slices"

	"golang.org/x/image/draw"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/ort"
)

// segmenter serves segment for isnetis-style background removal: the image is loaded
// whole and upright with its alpha (libvips), then (over white) resized to the model's
// square input (1024) with the triangle filter, x/255 RGB NCHW; the [0,1] mask output is
// resized back to the image and written as the alpha channel of an RGBA PNG, as a new file,
// at the request's out_path (which must be inside the spool directory or an output root,
// and must not exist) or under a fresh name in the spool directory.
type segmenter struct {
	base
	sess  *ort.Session
	input string
	size  int
}

func openSegmenter(env Env, m *config.Model, dir string) (Model, error) {
	s := &segmenter{base: newBase(env, m)}
	mp, err := mustFile(m, dir, "model")
	if err != nil {
		return nil, err
	}
	if s.sess, err = s.session(mp); err != nil {
		return nil, err
	}
	in, _ := s.sess.Input("")
	s.input, s.size = in.Name, dimOr(in.Shape, 2, 1024)
	return s, nil
}

type segItem struct {
	img    image.Image
	pixels []float32
	out    string
}

func (s *segmenter) Prepare(op string, req *codec.WorkItem) (Item, error) {
	if err := s.checkOp(op); err != nil {
		return nil, err
	}
	out := req.OutPath
	if out != "" {
		// Refused before the work; CreatePNG checks again when it writes.
		if _, err := s.env.Images.CheckWritable(out); err != nil {
			return nil, err
		}
	}
	img, _, err := s.image(req, images.LoadSpec{KeepAlpha: true})
	if err != nil {
		return nil, err
	}
	px := make([]float32, 3*s.size*s.size)
	images.ToCHW(images.Resize(images.FlattenOn(img, color.White), s.size, s.size, draw.BiLinear), px, images.ZeroMean, images.UnitStd, images.Scale255, false)
	return &segItem{img: img, pixels: px, out: out}, nil
}

func (s *segmenter) Run(ctx context.Context, op string, items []Item) ([]codec.Replier, []error) {
	replies := make([]codec.Replier, len(items))
	errs := make([]error, len(items))
	for i, it := range items {
		replies[i], errs[i] = s.one(ctx, it.(*segItem))
	}
	return replies, errs
}

func (s *segmenter) one(ctx context.Context, it *segItem) (codec.Replier, error) {
	in := ort.Tensor{Name: s.input, Shape: []int64{1, 3, int64(s.size), int64(s.size)}, Data: it.pixels}
	outs, err := s.sess.Run(ctx, []ort.Tensor{in})
	if err != nil {
		return nil, err
	}
	mask := outs[0]
	if len(mask.Shape) < 2 {
		return nil, codec.Errorf(codec.CodeInternal, "model %s mask shape %v has no height and width", s.name, mask.Shape)
	}
	mh, mw := int(mask.Shape[len(mask.Shape)-2]), int(mask.Shape[len(mask.Shape)-1])
	m := mask.Float32()
	if mh <= 0 || mw <= 0 || len(m) < mh*mw {
		return nil, codec.Errorf(codec.CodeInternal, "model %s mask output %v is not a float mask", s.name, mask.Shape)
	}
	rgba := images.MaskToRGBA(it.img, m[:mh*mw], mw, mh)
	out := it.out
	if out == "" {
		dir := s.env.SpoolDir
		if dir == "" {
			dir = os.TempDir()
		}
		if out, err = images.CreatePNGIn(dir, "ortbus-segment-", rgba, slices.Contains(s.env.Images.SyncRoots, dir)); err != nil {
			return nil, fmt.Errorf("write segment mask: %w", err)
		}
	} else if err := s.env.Images.CreatePNG(out, rgba); err != nil {
		return nil, err
	}
	b := it.img.Bounds()
	return &codec.SegmentReply{OutPath: out, Width: b.Dx(), Height: b.Dy()}, nil
}
