// Package images turns an untrusted image path from a request into pixels, and pixels into
// the tensors the model kinds expect.
//
// Paths arrive from clients on the bus, so every path goes through a [Policy] before a
// byte of it is read: it must be absolute and clean, lie inside an allowed root both
// lexically and after symlinks are resolved, and name a regular file. The file is read
// once, into a buffer bounded by [Policy.MaxBytes], and its header is decoded before its
// pixels, from that same buffer, so that a hostile "100000×100000" PNG is refused without
// allocating pixel memory. Outputs are written only as new files under the output roots,
// through an os.Root ([Policy.CreatePNG]). The infer op's tensors by path go under the
// same rules: [Policy.OpenTensor] reads a NumPy .npy file (package npy parses it) and
// [Policy.CreateTensor] writes one. Every refusal is a *codec.Error with one of the contract's stable codes
// (bad_request, forbidden_path, file_not_found, unsupported_image, image_too_large), so a
// worker can put it on the bus as it is.
//
// The preprocessing ops ([FlattenOn], [Resize], [PadSquare], [Letterbox], [ToCHW],
// [ToHWC], [MaskToRGBA]) are pure functions over image.Image values. All resampling goes
// through golang.org/x/image/draw. Every image they return has its origin at (0, 0).
//
// The model kinds read their inputs with [Policy.Load]: the same path checks and bounded
// read, then libvips (package images/vips, dlopen()ed at run time): the header first, its
// pixel bound checked before any decode, then the image straight to the kind's size
// (shrink on load), upright, in sRGB, 8-bit. It accepts [LoadFormats] (JPEG, PNG, WebP,
// HEIF/AVIF, TIFF, GIF, JPEG XL where libvips loads them; BMP through Go's decoder).
//
// [Policy.Open] decodes with Go's decoders (PNG, JPEG, GIF (first frame), BMP and WebP;
// other formats some other package registers with the image package are refused): the
// decode path before libvips, kept as the reference of the tests and benchmarks
// ([Policy.Reference] makes Load use it).
package images
