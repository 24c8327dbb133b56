package images

import "bytes"

// SniffLen is how many leading bytes of a file Sniff needs.
const SniffLen = 32

// Sniff names the image format of a file by its first bytes (at least SniffLen of them
// when the file has that many), or returns "" when they are no image format the workers
// load (libvips's loaders: JPEG, PNG, GIF, WebP, TIFF, BMP, AVIF and HEIF, JPEG XL, PNM).
// It reads only b: the content decides, not the name, so a photo saved without an
// extension is taken and a text file named .jpg is not. It never panics.
func Sniff(b []byte) string {
	switch {
	case bytes.HasPrefix(b, []byte{0xFF, 0xD8, 0xFF}):
		return "jpeg"
	case bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")):
		return "png"
	case bytes.HasPrefix(b, []byte("GIF87a")), bytes.HasPrefix(b, []byte("GIF89a")):
		return "gif"
	case len(b) >= 12 && bytes.Equal(b[:4], []byte("RIFF")) && bytes.Equal(b[8:12], []byte("WEBP")):
		return "webp"
	case bytes.HasPrefix(b, []byte("II*\x00")), bytes.HasPrefix(b, []byte("MM\x00*")),
		bytes.HasPrefix(b, []byte("II+\x00")), bytes.HasPrefix(b, []byte("MM\x00+")): // TIFF, BigTIFF
		return "tiff"
	case sniffBMP(b):
		return "bmp"
	case bytes.HasPrefix(b, []byte{0xFF, 0x0A}), bytes.HasPrefix(b, []byte("\x00\x00\x00\x0cJXL \r\n\x87\n")):
		return "jxl"
	case len(b) >= 3 && b[0] == 'P' && b[1] >= '1' && b[1] <= '6' && isSpace(b[2]):
		return "pnm"
	}
	if brand := ftypBrand(b); brand != "" {
		return brand
	}
	return ""
}

// ftypBrand is "avif" or "heif" for an ISO base media file (its ftyp box first) whose
// major or compatible brands name one, else "".
func ftypBrand(b []byte) string {
	if len(b) < 16 || !bytes.Equal(b[4:8], []byte("ftyp")) {
		return ""
	}
	size := int(b[0])<<24 | int(b[1])<<16 | int(b[2])<<8 | int(b[3])
	if size < 16 || size > len(b) {
		size = len(b) // the brands seen: the box runs past what was read
	}
	heif := ""
	for i := 8; i+4 <= size; i += 4 {
		if i == 12 {
			continue // minor version
		}
		switch string(b[i : i+4]) {
		case "avif", "avis":
			return "avif"
		case "heic", "heix", "hevc", "hevx", "heim", "heis", "mif1", "msf1":
			heif = "heif"
		}
	}
	return heif
}

// sniffBMP: "BM", then the file size, 4 reserved bytes, the pixels' offset, and a DIB
// header of one of the sizes its versions have.
func sniffBMP(b []byte) bool {
	if len(b) < 18 || !bytes.HasPrefix(b, []byte("BM")) {
		return false
	}
	switch int(b[14]) | int(b[15])<<8 | int(b[16])<<16 | int(b[17])<<24 {
	case 12, 16, 40, 52, 56, 64, 108, 124:
		return true
	}
	return false
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
