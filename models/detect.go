package models

import (
	"context"
	"image/color"
	"sort"
	"strconv"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/images"
	"github.com/ortbus/ortbus/ort"
)

// detector serves detect for YOLOv8-style models (the app's person detector): alpha over
// white, fitted into 640 without enlarging (libvips's thumbnail: shrink on load, then
// Lanczos3; a BMP, decoded by Go, with the triangle filter), letterboxed with grey (114)
// padding, x/255 RGB NCHW; output [N, 4+classes, anchors] with rows
// cx, cy, w, h, class scores; confidence threshold, per-class NMS, boxes mapped back to
// the original image's coordinates.
type detector struct {
	base
	sess      *ort.Session
	input     string
	size      int
	conf, iou float64
	labels    []string
}

func openDetector(env Env, m *config.Model, dir string) (Model, error) {
	d := &detector{base: newBase(env, m), conf: 0.25, iou: 0.7, labels: m.Labels}
	if m.Conf > 0 {
		d.conf = m.Conf
	}
	if m.IoU > 0 {
		d.iou = m.IoU
	}
	if len(d.labels) == 0 {
		d.labels = []string{"person"}
	}
	mp, err := mustFile(m, dir, "model")
	if err != nil {
		return nil, err
	}
	if d.sess, err = d.session(mp); err != nil {
		return nil, err
	}
	in, _ := d.sess.Input("")
	d.input, d.size = in.Name, dimOr(in.Shape, 2, 640)
	return d, nil
}

type detectItem struct {
	pixels    []float32
	lb        images.LetterboxInfo
	conf, iou float64
}

func (d *detector) Prepare(op string, req *codec.WorkItem) (Item, error) {
	if err := d.checkOp(op); err != nil {
		return nil, err
	}
	it := &detectItem{conf: d.conf, iou: d.iou}
	if req.Conf != nil {
		it.conf = *req.Conf
	}
	if req.IoU != nil {
		it.iou = *req.IoU
	}
	if it.conf < 0 || it.conf > 1 || it.iou < 0 || it.iou > 1 {
		return nil, codec.Errorf(codec.CodeBadRequest, "conf and iou must be in [0, 1]")
	}
	img, src, err := d.image(req, images.LoadSpec{Width: d.size, Height: d.size, Fill: images.FillFitDown, Background: images.WhiteRGBA})
	if err != nil {
		return nil, err
	}
	lb, info := images.Letterbox(images.FlattenOn(img, color.White), d.size, color.RGBA{114, 114, 114, 255}, false)
	it.lb = info.WithSource(src.Width, src.Height) // boxes in the upright whole image
	it.pixels = make([]float32, 3*d.size*d.size)
	images.ToCHW(lb, it.pixels, images.ZeroMean, images.UnitStd, images.Scale255, false)
	return it, nil
}

func (d *detector) Run(ctx context.Context, op string, items []Item) ([]codec.Replier, []error) {
	px := make([][]float32, len(items))
	for i, it := range items {
		px[i] = it.(*detectItem).pixels
	}
	in := stack(px, []int64{3, int64(d.size), int64(d.size)})
	in.Name = d.input
	outs, err := d.sess.Run(ctx, []ort.Tensor{in})
	if err != nil {
		return fail(len(items), err)
	}
	out := outs[0]
	if len(out.Shape) != 3 || out.Shape[1] < 5 {
		return fail(len(items), codec.Errorf(codec.CodeInternal, "model %s output shape %v is not [N, 4+classes, anchors]", d.name, out.Shape))
	}
	rows, anchors := int(out.Shape[1]), int(out.Shape[2])
	data := out.Float32()
	replies := make([]codec.Replier, len(items))
	for i, it := range items {
		di := it.(*detectItem)
		replies[i] = &codec.DetectReply{Boxes: d.decode(data[i*rows*anchors:(i+1)*rows*anchors], rows, anchors, di)}
	}
	return replies, make([]error, len(items))
}

func (d *detector) decode(o []float32, rows, anchors int, it *detectItem) []codec.Box {
	at := func(r, a int) float32 { return o[r*anchors+a] }
	var cands []codec.Box
	for a := 0; a < anchors; a++ {
		best, cls := float32(-1), 0
		for c := 4; c < rows; c++ {
			if s := at(c, a); s > best {
				best, cls = s, c-4
			}
		}
		if float64(best) < it.conf {
			continue
		}
		cx, cy, w, h := float64(at(0, a)), float64(at(1, a)), float64(at(2, a)), float64(at(3, a))
		x1, y1, x2, y2 := it.lb.MapBox(cx-w/2, cy-h/2, cx+w/2, cy+h/2)
		label := "class" + strconv.Itoa(cls)
		if cls < len(d.labels) {
			label = d.labels[cls]
		}
		cands = append(cands, codec.Box{X1: float32(x1), Y1: float32(y1), X2: float32(x2), Y2: float32(y2), Label: label, Score: best})
	}
	return nms(cands, float32(it.iou))
}

// nms keeps the highest-scoring box of each overlapping group (IoU > iou), per label.
func nms(boxes []codec.Box, iou float32) []codec.Box {
	sort.SliceStable(boxes, func(i, j int) bool { return boxes[i].Score > boxes[j].Score })
	kept := []codec.Box{}
	for _, b := range boxes {
		ok := true
		for _, k := range kept {
			if k.Label == b.Label && overlap(k, b) > iou {
				ok = false
				break
			}
		}
		if ok {
			kept = append(kept, b)
		}
	}
	return kept
}

func overlap(a, b codec.Box) float32 {
	ix := max(0, min(a.X2, b.X2)-max(a.X1, b.X1))
	iy := max(0, min(a.Y2, b.Y2)-max(a.Y1, b.Y1))
	inter := ix * iy
	union := (a.X2-a.X1)*(a.Y2-a.Y1) + (b.X2-b.X1)*(b.Y2-b.Y1) - inter
	if union <= 0 {
		return 0
	}
	return inter / union
}
