// The few libvips C functions ortbus calls, resolved with dlsym from the library found at
// run time (no libvips headers or library are needed to build). See vips.go.
#ifndef ORTBUS_VIPS_H
#define ORTBUS_VIPS_H
#include <stddef.h>

// ob_open dlopen()s path and resolves every symbol; 0 on success, else an error message
// (static or in err, of errlen bytes).
int ob_open(const char *path, char *err, size_t errlen);
// ob_init starts libvips with its operation cache off, concurrency threads per
// operation and the loaders libvips marks untrusted blocked. 0 on success.
int ob_init(int concurrency);
const char *ob_version(void);

// A header read from a buffer: the loader's nickname and the size as stored.
typedef struct {
	char loader[64];
	int width, height, bands, pages, orientation;
} ob_header;

// ob_header_buffer reads only the header of buf (no pixels): 0 on success, -1 when no
// loader recognises the bytes, -2 when the header cannot be read.
int ob_header_buffer(const void *buf, size_t len, ob_header *h);

// What ob_decode_buffer produces.
typedef struct {
	// width, height > 0: vips_thumbnail to that box (size: VipsSize, 0 both, 2 down-only, 3 force);
	// 0: the whole image at full size.
	int width, height, size;
	// alpha: keep (4 bands, straight alpha, 255 where opaque) rather than flatten.
	int keep_alpha;
	double background[3];
	// fail_on: VipsFailOn (1 truncated, 2 error).
	int fail_on;
	// The header, when the caller has read it (hdr_width > 0): its size as stored, its EXIF
	// orientation and whether it is a JPEG, so that the JPEG shrink is chosen without
	// reading the header again.
	int hdr_width, hdr_height, hdr_orientation, hdr_jpeg;
} ob_spec;

// ob_decode_buffer loads buf upright (EXIF orientation applied) in sRGB, 8 bits per
// sample, 3 bands (alpha flattened onto background) or 4 (keep_alpha). On success *out
// is a g_malloc'd buffer to release with ob_free. 0 on success, -1 on error.
int ob_decode_buffer(const void *buf, size_t len, const ob_spec *s, void **out, int *w, int *h, int *bands);

// ob_encode writes w*h*bands uchar pixels (bands 1..4) to an image file format chosen by
// suffix (with options: ".jpg[Q=90]"); colourspace: 0 as is, else a VipsInterpretation
// to convert to first (CMYK, B_W, RGB16, GREY16); orientation > 0 sets the EXIF
// orientation. *out is g_malloc'd (ob_free). 0 on success.
// page_height > 0 makes the image pages of that height (an animation, for GIF and WebP).
int ob_encode(const void *pix, int w, int h, int bands, const char *suffix, int colourspace, int orientation, int page_height, void **out, size_t *len);

// ob_tune_malloc sets glibc's allocator for a process that decodes images item after
// item (see malloc.go): arenas (M_ARENA_MAX), the mmap threshold and the trim threshold,
// in bytes. 0 done, -1 refused by mallopt, 1 not glibc (nothing done).
int ob_tune_malloc(int arenas, int mmap_threshold, int trim_threshold);

// ob_prefault mallocs n bytes, touches every page and frees them: with the allocator as
// ob_tune_malloc sets it (n under both thresholds) the pages stay in the heap, faulted in.
void ob_prefault(size_t n);

// ob_has_loader reports whether libvips has an operation of that nickname ("jpegload").
int ob_has_loader(const char *nickname);

void ob_free(void *p);
// ob_error copies and clears libvips's error buffer into err.
void ob_error(char *err, size_t errlen);
#endif
