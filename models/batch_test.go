package models

import (
	"testing"

	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/ort"
)

// TestBatchCap: the most items one runtime call stacks, per input shape — a batch
// dimension fixed at 1 takes one item (a YOLOv8 export's [1,3,640,640]), fixed at N at
// most N, symbolic no limit of the network's own (0: the pool's max_batch); the smallest
// over several inputs; a scalar input, no batching.
func TestBatchCap(t *testing.T) {
	in := func(shape ...int64) ort.IOInfo { return ort.IOInfo{Name: "x", Shape: shape, Type: "float32"} }
	cases := []struct {
		name   string
		inputs []ort.IOInfo
		want   int
	}{
		{"fixed 1 (YOLOv8 export)", []ort.IOInfo{in(1, 3, 640, 640)}, 1},
		{"fixed 4", []ort.IOInfo{in(4, 3, 448, 448)}, 4},
		{"symbolic", []ort.IOInfo{in(-1, 3, 448, 448)}, 0},
		{"symbolic, other dims symbolic", []ort.IOInfo{in(-1, -1)}, 0},
		{"pixels symbolic, mask fixed 1", []ort.IOInfo{in(-1, 3, 448, 448), in(1, 448, 448)}, 1},
		{"fixed 8 and fixed 2", []ort.IOInfo{in(8, 3), in(2, 3)}, 2},
		{"fixed 0", []ort.IOInfo{in(0, 3)}, 1},
		{"scalar input", []ort.IOInfo{in(-1, 3), in()}, 1},
		{"no inputs", nil, 0},
	}
	for _, c := range cases {
		if got := BatchCap(c.inputs); got != c.want {
			t.Errorf("%s: BatchCap = %d, want %d", c.name, got, c.want)
		}
	}
}

// TestModelMaxBatch: every kind applies BatchCap to the session its batched ops run on
// (the first it opens); a kind that batches nothing (segment, raw) takes one item a call;
// Batchable is the kind's and false for a network fixed at 1; Limit keeps a pool's
// max_batch within what the model takes, at least 1.
func TestModelMaxBatch(t *testing.T) {
	shapes := []struct {
		shape []int64
		cap   int
	}{{[]int64{1, 3, 64, 64}, 1}, {[]int64{4, 3, 64, 64}, 4}, {[]int64{-1, 3, 64, 64}, 0}}
	for _, k := range config.Kinds {
		for _, s := range shapes {
			b := newBase(Env{}, &config.Model{Name: "m", Kind: k.Name})
			sess := &ort.Session{Inputs: []ort.IOInfo{{Name: "x", Shape: s.shape, Type: "float32"}}}
			b.sessions, b.batched = []*ort.Session{sess}, sess
			// A second session (ccip's metrics network) does not enter it.
			b.sessions = append(b.sessions, &ort.Session{Inputs: []ort.IOInfo{{Name: "y", Shape: []int64{1, 8}, Type: "float32"}}})
			want := s.cap
			if len(k.Batch) == 0 {
				want = 1
			}
			if got := b.MaxBatch(); got != want {
				t.Errorf("kind %s, input %v: MaxBatch %d, want %d", k.Name, s.shape, got, want)
			}
			for _, op := range k.Ops {
				if got, want := b.Batchable(op), k.Batchable(op) && want != 1; got != want {
					t.Errorf("kind %s, input %v: Batchable(%s) = %v, want %v", k.Name, s.shape, op, got, want)
				}
			}
			for _, pool := range []int{0, 1, 8} {
				want := max(1, pool)
				if c := b.MaxBatch(); c > 0 {
					want = max(1, min(pool, c))
				}
				if got := Limit(&b, pool); got != want {
					t.Errorf("kind %s, input %v: Limit(max_batch %d) = %d, want %d", k.Name, s.shape, pool, got, want)
				}
			}
		}
	}
}
