package vips

/*
#include "vips.h"
*/
import "C"

import (
	"time"
)

// warmFormats are the formats WarmUp decodes once: a small image of each, written by
// this libvips (a format it cannot write is not warmed), in the ways a library holds
// them (a progressive JPEG and a 16-bit PNG take other paths of their loaders). Not CMYK:
// its colour transform is built anew for every image (about 35 ms each way), so warming
// it would cost every worker's start that much and save no later image anything.
var warmFormats = []struct{ suffix, to string }{
	{".jpg", ""}, {".jpg[interlace]", ""}, {".png", ""}, {".png", "rgb16"},
	{".webp", ""}, {".avif", ""}, {".tif", ""}, {".gif", ""},
}

// WarmHeap is the heap WarmUp faults in when the allocator is tuned (TuneMalloc): about
// a 12 MP photo's working buffers at its shrink-on-load size.
const WarmHeap = 24 << 20

// WarmUp runs the decode path once per format before the first request: libvips starts
// each loader (and the codec libraries behind it: libjpeg, libspng, libwebp, libheif,
// libtiff, libnsgif) lazily on its first image, which costs the first photo of each kind tens of
// milliseconds more (a 2K AVIF 200 ms instead of 60). When TuneMalloc set the allocator,
// WarmHeap bytes of heap are also faulted in, where the first items' buffers will be
// kept. It returns the formats warmed and how long it took; a format that fails is
// skipped.
func (l *Lib) WarmUp() (warmed int, took time.Duration) {
	t0 := time.Now()
	const side = 64
	pix := make([]byte, side*side*3)
	for i := range pix {
		pix[i] = byte(i * 7)
	}
	for _, f := range warmFormats {
		data, err := l.Encode(pix, side, side, 3, f.suffix, f.to, 0)
		if err != nil {
			continue
		}
		if _, _, err := l.Load(data, side*side, Spec{Width: side / 2, Height: side / 2, Size: Force, Background: [3]uint8{255, 255, 255}}, nil); err == nil {
			warmed++
		}
	}
	if mallocTuned.Load() {
		C.ob_prefault(C.size_t(WarmHeap))
	}
	return warmed, time.Since(t0)
}
