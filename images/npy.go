package images

import (
	"io"
	"os"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/npy"
)

// Tensors by path: the infer op's input_paths and output files are NumPy .npy files under
// the same rules as images (package npy reads and writes the format).

// OpenTensor checks path as Open does (absolute and clean, inside an allowed root as
// spelled and once its symlinks are resolved, a regular file), reads it whole, within
// MaxBytes (security.max_image_bytes), and decodes it as a .npy tensor. Errors are
// *codec.Error with details path:
//
//   - bad_request: path empty, relative or not clean; a directory or other non-regular
//     file; a file that is not a .npy file of a tensor type (package npy says why:
//     magic, version, header, dtype, fortran order, a shape over codec.MaxTensorElems, or
//     data that is not exactly the size the header declares);
//   - forbidden_path, file_not_found: as Open;
//   - image_too_large: a file over MaxBytes (details bytes, max_bytes).
//
// The tensor's data is the file's bytes after its header, read once.
func (p Policy) OpenTensor(path string) (*codec.Tensor, error) {
	roots, err := p.admit(path)
	if err != nil {
		return nil, err
	}
	resolved, err := resolveInside(path, roots)
	if err != nil {
		return nil, err
	}
	f, err := openRegular(resolved, rootOf(roots, resolved), path, kindTensor)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, resolveError(err, path)
	}
	data, err := readBounded(f, fi.Size(), p.maxBytes(), path, kindTensor)
	if err != nil {
		return nil, withPath(err, path)
	}
	t, err := npy.Decode(data)
	if err != nil {
		return nil, codec.Errorf(codec.CodeBadRequest, "%s is not a usable .npy tensor: %v", path, err).With("path", path)
	}
	return t, nil
}

// CreateTensor writes t as a new .npy file at path, an output path from a request (check
// it first with CheckWritable): the rules, the steps and the errors are CreatePNG's. t must
// be valid (else internal: it comes from a model).
func (p Policy) CreateTensor(path string, t *codec.Tensor) error {
	header, err := npy.HeaderOf(t)
	if err != nil {
		return codec.Errorf(codec.CodeInternal, "cannot write %s: %v", path, err).With("path", path)
	}
	return p.create(path, func(r *os.Root, rel string, sync bool) error {
		return writeNewIn(r, rel, false, sync, func(w io.Writer) error {
			if _, err := w.Write(header); err != nil {
				return err
			}
			_, err := w.Write(npy.DataOf(t))
			return err
		})
	})
}
