package images

import (
	"bufio"
	"crypto/rand"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/ortbus/ortbus/codec"
)

// CreatePNG writes img as a new PNG file at path, an output path from a request (check it
// first with CheckWritable, before the work that produces img). path must be absolute,
// clean and inside an output root. The file is written under a temporary name in its
// directory and then given its name without replacing anything: if something exists at
// path by then, nothing is replaced and the answer is forbidden_path. Every step goes
// through an os.Root opened at the output root that holds path, so a directory on the way
// that was swapped for a symlink leading out of the root (after the check, or during the
// write) makes the write fail with forbidden_path instead of landing outside. Other
// errors: bad_request (path not absolute or not clean, a symlink loop), file_not_found
// (its directory does not exist), internal (the disk).
func (p Policy) CreatePNG(path string, img image.Image) error {
	return p.create(path, func(r *os.Root, rel string, sync bool) error { return writePNGIn(r, rel, img, false, sync) })
}

// create checks an output path and calls write with an os.Root at the output root that
// holds it, the path relative to that root, and whether that root's files are fsynced
// (SyncRoots); errors from write are mapped to codes.
func (p Policy) create(path string, write func(r *os.Root, rel string, sync bool) error) error {
	roots, err := p.admitOutput(path)
	if err != nil {
		return err
	}
	root := rootOf(roots, path)
	rel, err := filepath.Rel(root, path)
	if err != nil || rel == "." {
		// The root itself was named: its parent is outside every root.
		return forbiddenOutput(path)
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return outputError(err, path)
	}
	defer r.Close()
	if err := write(r, rel, p.syncs(root)); err != nil {
		return outputError(err, path)
	}
	return nil
}

// CreatePNGIn writes img as a new PNG file directly in dir (a trusted directory, such as
// the spool directory), named prefix, a random part and ".png", and returns its path. It
// writes through an os.Root at dir and never replaces a file; sync fsyncs it (see
// Policy.SyncRoots).
func CreatePNGIn(dir, prefix string, img image.Image, sync bool) (string, error) {
	r, err := os.OpenRoot(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// The operator's to fix, not the request's: say which directory and which key.
		return "", codec.Errorf(codec.CodeUnavailable, "the spool directory %s does not exist: create it, or set [security] spool_dir in the config", dir).With("path", dir)
	case errors.Is(err, fs.ErrPermission):
		return "", codec.Errorf(codec.CodeUnavailable, "the spool directory %s is not writable by the worker: fix its permissions, or set [security] spool_dir", dir).With("path", dir)
	case err != nil:
		return "", fmt.Errorf("images: output directory: %w", err)
	}
	defer r.Close()
	for range 5 {
		name := prefix + strings.ToLower(rand.Text()) + ".png"
		err := writePNGIn(r, name, img, false, sync)
		if err == nil {
			return filepath.Join(dir, name), nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("images: write %s: %w", filepath.Join(dir, name), err)
		}
	}
	return "", fmt.Errorf("images: no free file name in %s", dir)
}

// WritePNG encodes img as PNG to path, for trusted paths (tools and tests; requests'
// outputs go through CreatePNG): it writes a temporary file in the same directory, syncs
// it, makes it world-readable (0644) and renames it over path, through an os.Root at the
// directory, so a reader never sees a partial file and a symlink at path is replaced
// rather than written through.
func WritePNG(path string, img image.Image) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	if base == "" {
		return fmt.Errorf("images: write %s: no file name", path)
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("images: write %s: %w", path, err)
	}
	defer r.Close()
	if err := writePNGIn(r, base, img, true, true); err != nil {
		return fmt.Errorf("images: write %s: %w", path, err)
	}
	return nil
}

// writePNGIn encodes img as PNG into name relative to r (see writeNewIn).
func writePNGIn(r *os.Root, name string, img image.Image, replace, sync bool) error {
	return writeNewIn(r, name, replace, sync, func(w io.Writer) error {
		enc := png.Encoder{CompressionLevel: png.BestSpeed}
		if err := enc.Encode(w, img); err != nil {
			return fmt.Errorf("encode: %w", err)
		}
		return nil
	})
}

// writeNewIn writes a new temporary file next to name (relative to r) with write, syncs
// it (when sync), makes it 0644 and gives it name: replacing whatever is there when replace is set,
// else by a hard link that fails with fs.ErrExist if name exists. The temporary file is
// removed in every case. Errors are the os package's (or write's), unwrapped.
func writeNewIn(r *os.Root, name string, replace, sync bool, write func(io.Writer) error) (err error) {
	dir, base := filepath.Split(name)
	tmp := filepath.Join(dir, "."+base+".tmp-"+strings.ToLower(rand.Text()))
	f, err := r.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	closed := false
	defer func() {
		if !closed {
			f.Close()
		}
		if err != nil || !replace {
			r.Remove(tmp)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<16)
	if err := write(bw); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		return err
	}
	if sync {
		if err := f.Sync(); err != nil {
			return err
		}
	}
	closed = true
	if err := f.Close(); err != nil {
		return err
	}
	if replace {
		return r.Rename(tmp, name)
	}
	err = r.Link(tmp, name)
	if err != nil && linkUnsupported(err) {
		// A filesystem without hard links: check, then rename. Between the two, a file
		// created at name by someone else would be replaced; the path is still confined
		// to the root.
		if _, lerr := r.Lstat(name); lerr == nil {
			return &fs.PathError{Op: "create", Path: name, Err: fs.ErrExist}
		} else if !errors.Is(lerr, fs.ErrNotExist) {
			return lerr
		}
		err = r.Rename(tmp, name)
	}
	return err
}

// linkUnsupported reports whether a link failed because the filesystem has no hard links.
func linkUnsupported(err error) bool {
	return errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS)
}

// outputError maps an error met while writing the output path to a code.
func outputError(err error, path string) error {
	switch {
	case errors.Is(err, fs.ErrExist):
		return exists(path)
	case strings.Contains(err.Error(), "escapes"):
		return forbiddenOutput(path)
	case isMissing(err):
		return codec.Errorf(codec.CodeFileNotFound, "output directory of %q does not exist", path).With("path", path)
	case errors.Is(err, fs.ErrPermission):
		return codec.Errorf(codec.CodeForbiddenPath, "permission denied: %s", path).With("path", path)
	case errors.Is(err, syscall.ELOOP):
		return codec.Errorf(codec.CodeBadRequest, "too many levels of symbolic links: %s", path).With("path", path)
	}
	return codec.Errorf(codec.CodeInternal, "cannot write %s: %v", path, err).With("path", path)
}
