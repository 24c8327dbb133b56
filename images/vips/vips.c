// See vips.h. Variadic libvips calls are made here, with NULL-terminated option lists.
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include "vips.h"

typedef void VImg;
typedef int (*fn_init)(const char *);
typedef int (*fn_version)(int);
typedef const char *(*fn_version_string)(void);
typedef void (*fn_set_int)(int);
typedef void (*fn_set_size)(size_t);
typedef void (*fn_unref)(void *);
typedef const char *(*fn_find_load_buffer)(const void *, size_t);
typedef VImg *(*fn_new_from_buffer)(const void *, size_t, const char *, ...);
typedef int (*fn_thumbnail_buffer)(void *, size_t, VImg **, int, ...);
typedef int (*fn_op1)(VImg *, VImg **, ...);
typedef int (*fn_op_int)(VImg *, VImg **, int, ...);
typedef int (*fn_bjc)(VImg *, VImg **, double, ...);
typedef int (*fn_getter)(const VImg *);
typedef int (*fn_hasalpha)(VImg *);
typedef void *(*fn_write_to_memory)(VImg *, size_t *);
typedef int (*fn_write_to_buffer)(VImg *, const char *, void **, size_t *, ...);
typedef VImg *(*fn_new_from_memory_copy)(const void *, size_t, int, int, int, int);
typedef void (*fn_image_set_int)(VImg *, const char *, int);
typedef void *(*fn_array_double_new)(const double *, int);
typedef char *(*fn_error_buffer_copy)(void);
typedef unsigned long (*fn_type_find)(const char *, const char *);
typedef void (*fn_void)(void);
typedef void (*fn_free)(void *);

static struct {
	fn_init init;
	fn_version version;
	fn_version_string version_string;
	fn_set_int cache_set_max, cache_set_max_files, concurrency_set, block_untrusted_set;
	fn_set_size cache_set_max_mem;
	fn_unref g_object_unref, area_unref;
	fn_find_load_buffer find_load_buffer;
	fn_new_from_buffer new_from_buffer;
	fn_thumbnail_buffer thumbnail_buffer;
	fn_op_int thumbnail_image;
	fn_op1 autorot, flatten, copy;
	fn_op_int colourspace, cast;
	fn_op_int extract_band;
	fn_bjc bandjoin_const1;
	fn_getter width, height, bands, n_pages, orientation;
	fn_hasalpha hasalpha;
	fn_write_to_memory write_to_memory;
	fn_write_to_buffer write_to_buffer;
	fn_new_from_memory_copy new_from_memory_copy;
	fn_image_set_int image_set_int;
	fn_array_double_new array_double_new;
	fn_error_buffer_copy error_buffer_copy;
	fn_void error_clear;
	fn_type_find type_find;
	fn_free g_free;
} V;

#define SYM(field, name)                                                              \
	do {                                                                          \
		*(void **)(&V.field) = dlsym(h, name);                                \
		if (!V.field) {                                                       \
			snprintf(err, errlen, "libvips at %s lacks %s", path, name); \
			return -1;                                                    \
		}                                                                     \
	} while (0)

int ob_open(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return -1;
	}
	SYM(init, "vips_init");
	SYM(version, "vips_version");
	SYM(version_string, "vips_version_string");
	SYM(cache_set_max, "vips_cache_set_max");
	SYM(cache_set_max_files, "vips_cache_set_max_files");
	SYM(cache_set_max_mem, "vips_cache_set_max_mem");
	SYM(concurrency_set, "vips_concurrency_set");
	SYM(block_untrusted_set, "vips_block_untrusted_set");
	SYM(g_object_unref, "g_object_unref");
	SYM(area_unref, "vips_area_unref");
	SYM(find_load_buffer, "vips_foreign_find_load_buffer");
	SYM(new_from_buffer, "vips_image_new_from_buffer");
	SYM(thumbnail_buffer, "vips_thumbnail_buffer");
	SYM(thumbnail_image, "vips_thumbnail_image");
	SYM(autorot, "vips_autorot");
	SYM(flatten, "vips_flatten");
	SYM(copy, "vips_copy");
	SYM(colourspace, "vips_colourspace");
	SYM(cast, "vips_cast");
	SYM(extract_band, "vips_extract_band");
	SYM(bandjoin_const1, "vips_bandjoin_const1");
	SYM(width, "vips_image_get_width");
	SYM(height, "vips_image_get_height");
	SYM(bands, "vips_image_get_bands");
	SYM(n_pages, "vips_image_get_n_pages");
	SYM(orientation, "vips_image_get_orientation");
	SYM(hasalpha, "vips_image_hasalpha");
	SYM(write_to_memory, "vips_image_write_to_memory");
	SYM(write_to_buffer, "vips_image_write_to_buffer");
	SYM(new_from_memory_copy, "vips_image_new_from_memory_copy");
	SYM(image_set_int, "vips_image_set_int");
	SYM(array_double_new, "vips_array_double_new");
	SYM(error_buffer_copy, "vips_error_buffer_copy");
	SYM(error_clear, "vips_error_clear");
	SYM(type_find, "vips_type_find");
	SYM(g_free, "g_free");
	return 0;
}

int ob_init(int concurrency) {
	// Hostile files make libvips warn on stderr (truncated data, odd chunks): the
	// answer's error says what failed, so its warnings are off (VIPS_WARNING defined;
	// a value already in the environment is kept).
	setenv("VIPS_WARNING", "0", 0);
	if (V.init("ortbus") != 0)
		return -1;
	V.cache_set_max(0);
	V.cache_set_max_mem(0);
	V.cache_set_max_files(0);
	V.concurrency_set(concurrency > 0 ? concurrency : 1);
	V.block_untrusted_set(1);
	return 0;
}

const char *ob_version(void) { return V.version_string(); }

enum { ACCESS_SEQUENTIAL = 1, INTERP_SRGB = 22, FORMAT_UCHAR = 0 };

int ob_header_buffer(const void *buf, size_t len, ob_header *h) {
	V.error_clear();
	const char *l = V.find_load_buffer(buf, len);
	if (!l)
		return -1;
	snprintf(h->loader, sizeof h->loader, "%s", l);
	VImg *im = V.new_from_buffer(buf, len, "", "access", ACCESS_SEQUENTIAL, NULL);
	if (!im)
		return -2;
	h->width = V.width(im);
	h->height = V.height(im);
	h->bands = V.bands(im);
	h->pages = V.n_pages(im);
	h->orientation = V.orientation(im);
	V.g_object_unref(im);
	return 0;
}

// step replaces *im by out (unreffing the old one); -1 when the operation failed.
static int step(VImg **im, int rc, VImg *out) {
	if (rc != 0 || !out) {
		V.g_object_unref(*im);
		*im = NULL;
		return -1;
	}
	V.g_object_unref(*im);
	*im = out;
	return 0;
}

// jpeg_shrink is the JPEG DCT scaling (1, 2, 4 or 8) to load buf with so that the box of
// s still needs shrinking, or reducing by less than 2, from there: as sharp does
// (fastShrinkOnLoad), where vips_thumbnail keeps a margin of 2 more (a 12 MP photo to 448
// decodes at 2016x1512 rather than 1008x756, at twice the cost). 1 for any other format;
// -1 when the header cannot be read.
static int jpeg_shrink(const void *buf, size_t len, const ob_spec *s) {
	double w, ht;
	int o;
	if (s->hdr_width > 0) {
		if (!s->hdr_jpeg)
			return 1;
		w = s->hdr_width;
		ht = s->hdr_height;
		o = s->hdr_orientation;
	} else {
		const char *l = V.find_load_buffer(buf, len);
		if (!l || strcmp(l, "VipsForeignLoadJpegBuffer") != 0)
			return 1;
		VImg *h = V.new_from_buffer(buf, len, "", "access", ACCESS_SEQUENTIAL, NULL);
		if (!h)
			return -1;
		w = V.width(h);
		ht = V.height(h);
		o = V.orientation(h);
		V.g_object_unref(h);
	}
	if (o >= 5 && o <= 8) {
		double x = w;
		w = ht;
		ht = x;
	}
	double fx = w / s->width, fy = ht / s->height;
	// Force fills each axis: the smaller factor; a fit, the larger.
	double f = s->size == 3 ? (fx < fy ? fx : fy) : (fx > fy ? fx : fy);
	return f >= 8 ? 8 : f >= 4 ? 4 : f >= 2 ? 2 : 1;
}

int ob_decode_buffer(const void *buf, size_t len, const ob_spec *s, void **out, int *w, int *h, int *bands) {
	VImg *im = NULL, *t = NULL;
	int rc;
	*out = NULL;
	V.error_clear();
	if (s->width > 0 && s->height > 0) {
		int shrink = jpeg_shrink(buf, len, s);
		if (shrink < 0)
			return -1;
		if (shrink > 1) {
			im = V.new_from_buffer(buf, len, "", "access", ACCESS_SEQUENTIAL, "shrink", shrink, "fail_on", s->fail_on, NULL);
			if (!im)
				return -1;
			t = NULL;
			rc = V.thumbnail_image(im, &t, s->width, "height", s->height, "size", s->size, NULL);
			if (step(&im, rc, t))
				return -1;
		}
		// vips_thumbnail: shrink-on-load, EXIF autorotation, import to sRGB (ICC, CMYK).
		else if (V.thumbnail_buffer((void *)buf, len, &im, s->width, "height", s->height, "size", s->size,
				       "fail_on", s->fail_on, "option_string", s->fail_on >= 2 ? "fail_on=error" : "fail_on=truncated", NULL) != 0)
			return -1;
	} else {
		// Random access: autorot's transposes read the image out of order. In memory:
		// never a temporary file on disk, however large (the pixel bound holds the size).
		im = V.new_from_buffer(buf, len, "", "memory", 1, "fail_on", s->fail_on, NULL);
		if (!im)
			return -1;
		t = NULL;
		rc = V.autorot(im, &t, NULL);
		if (step(&im, rc, t))
			return -1;
	}
	t = NULL;
	rc = V.colourspace(im, &t, INTERP_SRGB, NULL);
	if (step(&im, rc, t))
		return -1;
	if (V.hasalpha(im) && !s->keep_alpha) {
		void *bg = V.array_double_new(s->background, 3);
		t = NULL;
		rc = V.flatten(im, &t, "background", bg, NULL);
		V.area_unref(bg);
		if (step(&im, rc, t))
			return -1;
	}
	t = NULL;
	rc = V.cast(im, &t, FORMAT_UCHAR, NULL);
	if (step(&im, rc, t))
		return -1;
	int want = s->keep_alpha ? 4 : 3;
	if (s->keep_alpha && V.bands(im) == 3) {
		t = NULL;
		rc = V.bandjoin_const1(im, &t, 255.0, NULL);
		if (step(&im, rc, t))
			return -1;
	}
	if (V.bands(im) > want) {
		t = NULL;
		rc = V.extract_band(im, &t, 0, "n", want, NULL);
		if (step(&im, rc, t))
			return -1;
	}
	if (V.bands(im) != want) {
		V.g_object_unref(im);
		return -3;
	}
	size_t n = 0;
	void *mem = V.write_to_memory(im, &n);
	*w = V.width(im);
	*h = V.height(im);
	*bands = V.bands(im);
	V.g_object_unref(im);
	if (!mem)
		return -1;
	if (n != (size_t)(*w) * (size_t)(*h) * (size_t)(*bands)) {
		V.g_free(mem);
		return -3;
	}
	*out = mem;
	return 0;
}

int ob_encode(const void *pix, int w, int h, int bands, const char *suffix, int colourspace, int orientation, int page_height, void **out, size_t *len) {
	V.error_clear();
	VImg *im = V.new_from_memory_copy(pix, (size_t)w * h * bands, w, h, bands, FORMAT_UCHAR);
	VImg *t = NULL;
	int rc;
	*out = NULL;
	if (!im)
		return -1;
	if (colourspace) {
		rc = V.colourspace(im, &t, colourspace, NULL);
		if (step(&im, rc, t))
			return -1;
	}
	if (orientation > 0 || page_height > 0) {
		t = NULL;
		rc = V.copy(im, &t, NULL);
		if (step(&im, rc, t))
			return -1;
		if (orientation > 0)
			V.image_set_int(im, "orientation", orientation);
		if (page_height > 0)
			V.image_set_int(im, "page-height", page_height);
	}
	rc = V.write_to_buffer(im, suffix, out, len, NULL);
	V.g_object_unref(im);
	return rc;
}

int ob_has_loader(const char *nickname) { return V.type_find("VipsOperation", nickname) != 0; }

void ob_free(void *p) {
	if (p)
		V.g_free(p);
}

void ob_error(char *err, size_t errlen) {
	char *e = V.error_buffer_copy();
	snprintf(err, errlen, "%s", e ? e : "");
	if (e)
		V.g_free(e);
}


int ob_tune_malloc(int arenas, int mmap_threshold, int trim_threshold) {
#ifdef __GLIBC__
	// mallopt returns 1 on success; setting the thresholds also ends glibc's dynamic
	// adjustment of them.
	if (mallopt(M_ARENA_MAX, arenas) != 1 || mallopt(M_MMAP_THRESHOLD, mmap_threshold) != 1 ||
	    mallopt(M_TRIM_THRESHOLD, trim_threshold) != 1)
		return -1;
	return 0;
#else
	(void)arenas;
	(void)mmap_threshold;
	(void)trim_threshold;
	return 1;
#endif
}

void ob_prefault(size_t n) {
	// The buffer escapes through a volatile pointer: malloc, memset and free cannot be
	// elided.
	static void *volatile held;
	char *p = malloc(n);
	if (!p)
		return;
	held = p;
	memset(p, 0, n);
	free(p);
	held = NULL;
}
