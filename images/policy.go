package images

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/ortbus/ortbus/codec"
)

// DefaultMaxPixels is the pixel limit used when Policy.MaxPixels is zero or negative:
// 16384×8192 (128 Mi pixels), so that a 100 MP camera photo (11648×8736) is accepted. A
// decoded image of that size takes 512 MiB as RGBA, before any resizing.
const DefaultMaxPixels int64 = 16384 * 8192

// DefaultMaxBytes is the file size limit used when Policy.MaxBytes is zero or negative:
// 128 MiB, more than a 100 MP JPEG. Open holds the whole file in memory while decoding.
const DefaultMaxBytes int64 = 128 << 20

// maxLinks bounds the symlinks followed while locating a missing path, as the kernel does.
const maxLinks = 255

// Policy says which image paths a worker may read, which output paths it may write, and
// how big an image it may read and decode. The zero Policy allows no path at all.
//
// Roots are compared component-wise, both as configured and with their symlinks resolved,
// so a root that is itself a symlink (/srv/img -> /data/img) accepts paths under either
// spelling, and /srv/img2 is never inside /srv/img. A root that is not absolute is ignored.
type Policy struct {
	// AllowedRoots are the directories under which paths are accepted.
	AllowedRoots []string
	// OutputRoots are the directories under which outputs may be written (the spool
	// directory and security.output_roots); AllowedRoots give no right to write.
	OutputRoots []string
	// SyncRoots are the output roots whose files are fsynced before the answer goes
	// (config security.fsync_roots): durable across a power loss. The others' files (by
	// default the spool's: temporary files a client reads right after the answer, from the
	// page cache) are not: the sync costs an output's write time and proves nothing there.
	SyncRoots []string
	// MaxPixels is the largest width*height that Open decodes; <= 0 means DefaultMaxPixels.
	MaxPixels int64
	// MaxBytes is the largest file that Open reads; <= 0 means DefaultMaxBytes.
	MaxBytes int64
	// Reference makes Load decode as Open does, with Go's decoders, the whole image and
	// no EXIF orientation, so that the model kinds resample it in Go: the decode path
	// before libvips, kept only as the reference of the tests and benchmarks. No config
	// sets it.
	Reference bool
}

// maxBytes returns the effective file size limit.
func (p Policy) maxBytes() int64 {
	if p.MaxBytes <= 0 {
		return DefaultMaxBytes
	}
	return p.MaxBytes
}

// maxPixels returns the effective pixel limit.
func (p Policy) maxPixels() int64 {
	if p.MaxPixels <= 0 {
		return DefaultMaxPixels
	}
	return p.MaxPixels
}

// Validate reports configuration mistakes: no roots, a root that is not absolute, or one
// that does not resolve to an existing directory. Open and Check work without calling it
// (such roots simply match nothing), but a service should call it at start-up so that a
// typo in the config fails loudly instead of refusing every request.
func (p Policy) Validate() error {
	if len(p.AllowedRoots) == 0 {
		return errors.New("images: no allowed roots configured")
	}
	for _, r := range p.AllowedRoots {
		if !filepath.IsAbs(r) {
			return fmt.Errorf("images: allowed root %q is not an absolute path", r)
		}
		resolved, err := filepath.EvalSymlinks(r)
		if err != nil {
			return fmt.Errorf("images: allowed root %q: %w", r, err)
		}
		fi, err := os.Stat(resolved)
		if err != nil {
			return fmt.Errorf("images: allowed root %q: %w", r, err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("images: allowed root %q is not a directory", r)
		}
	}
	return nil
}

// Check does the path checks of Open without opening anything: path is absolute and
// clean, lies inside an allowed root, exists, and still lies inside an allowed root once
// its symlinks are resolved. It returns the resolved path. It does not look at the file's
// type or contents; Open does.
func (p Policy) Check(path string) (resolved string, err error) {
	roots, err := p.admit(path)
	if err != nil {
		return "", err
	}
	return resolveInside(path, roots)
}

// Admit does only the lexical checks of Check, with no filesystem access but the roots':
// path is absolute and clean (else bad_request) and inside an allowed root as written
// (else forbidden_path). A job's submit checks its items so (gateway/jobs.go); each is
// checked in full where it is read.
func (p Policy) Admit(path string) error {
	_, err := p.admit(path)
	return err
}

// CheckWritable checks an output path (for example a segmentation mask's out_path) before
// the work that produces the output, so a bad path is refused early: path is absolute and
// clean, lies inside an output root (OutputRoots; AllowedRoots do not count), its
// directory exists and resolves inside an output root, and nothing exists at path yet
// (forbidden_path: an output never replaces a file). It returns the resolved directory
// joined with the file name. It is only a check: write with CreatePNG, which checks again
// and writes through an os.Root, so that what changes in between cannot redirect it.
func (p Policy) CheckWritable(path string) (string, error) {
	roots, err := p.admitOutput(path)
	if err != nil {
		return "", err
	}
	dir, base := filepath.Split(path)
	if base == "" {
		return "", codec.Errorf(codec.CodeBadRequest, "output path %q has no file name", path).With("path", path)
	}
	dir = filepath.Clean(dir)
	if !insideAny(roots, dir) {
		// The root itself was named: its parent is outside every root.
		return "", forbiddenOutput(path)
	}
	rdir, err := resolveInside(dir, roots)
	if err != nil {
		switch codec.CodeOf(err) {
		case codec.CodeFileNotFound:
			return "", codec.Errorf(codec.CodeFileNotFound, "output directory %q does not exist", dir).With("path", path)
		case codec.CodeForbiddenPath:
			return "", forbiddenOutput(path)
		}
		return "", withPath(err, path)
	}
	if fi, err := os.Stat(rdir); err != nil || !fi.IsDir() {
		return "", codec.Errorf(codec.CodeBadRequest, "output directory %q is not a directory", dir).With("path", path)
	}
	out := filepath.Join(rdir, base)
	fi, err := os.Lstat(out)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return out, nil
	case err != nil:
		return "", resolveError(err, path)
	case fi.IsDir():
		return "", codec.Errorf(codec.CodeBadRequest, "output path %q is a directory", path).With("path", path)
	}
	return "", exists(path)
}

// admit does the lexical checks that need no filesystem access: the path must be absolute
// and clean (else bad_request) and inside a root as spelled (else forbidden_path). Doing
// these first means a client learns nothing about files outside the roots. It returns the
// roots to compare resolved paths against: each configured root and its resolution.
func (p Policy) admit(path string) ([]string, error) {
	if err := lexical(path); err != nil {
		return nil, err
	}
	roots := rootsOf(p.AllowedRoots)
	if !insideAny(roots, path) {
		return nil, outsideRoots(path, p.AllowedRoots)
	}
	return roots, nil
}

// admitOutput is admit for an output path, against the output roots.
func (p Policy) admitOutput(path string) ([]string, error) {
	if err := lexical(path); err != nil {
		return nil, err
	}
	roots := rootsOf(p.OutputRoots)
	if !insideAny(roots, path) {
		return nil, forbiddenOutput(path)
	}
	return roots, nil
}

// lexical refuses a path that is empty, has a NUL byte, or is not absolute and clean.
func lexical(path string) error {
	switch {
	case path == "":
		return codec.Errorf(codec.CodeBadRequest, "empty path")
	case strings.IndexByte(path, 0) >= 0:
		return codec.Errorf(codec.CodeBadRequest, "path contains a NUL byte").With("path", path)
	case !filepath.IsAbs(path):
		return codec.Errorf(codec.CodeBadRequest, "path %q is not absolute", path).With("path", path)
	case filepath.Clean(path) != path:
		return codec.Errorf(codec.CodeBadRequest, "path %q is not clean (it should be %q)", path, filepath.Clean(path)).With("path", path)
	}
	return nil
}

// rootsOf returns every usable root of list, as configured (cleaned) and symlink-resolved.
// A resolved path is inside a configured root only if that root contains no symlink, so
// comparing against both spellings never admits more than the resolved roots would.
func rootsOf(list []string) []string {
	out := make([]string, 0, 2*len(list))
	for _, r := range list {
		if !filepath.IsAbs(r) {
			continue
		}
		r = filepath.Clean(r)
		out = append(out, r)
		if resolved, err := filepath.EvalSymlinks(r); err == nil && resolved != r {
			out = append(out, resolved)
		}
	}
	return out
}

// within reports whether path is root or lies below it, component-wise: /srv/img2 is not
// within /srv/img. Both must be absolute and clean.
func within(root, path string) bool {
	if !strings.HasPrefix(path, root) {
		return false
	}
	if len(path) == len(root) || strings.HasSuffix(root, string(filepath.Separator)) {
		return true
	}
	return path[len(root)] == filepath.Separator
}

// insideAny reports whether path is within any of roots.
func insideAny(roots []string, path string) bool {
	for _, r := range roots {
		if within(r, path) {
			return true
		}
	}
	return false
}

// rootOf returns the longest root that path is within, or "" if none.
func rootOf(roots []string, path string) string {
	best := ""
	for _, r := range roots {
		if within(r, path) && len(r) > len(best) {
			best = r
		}
	}
	return best
}

// resolveInside resolves path's symlinks and requires the result to be inside roots.
// A path that does not exist is file_not_found only if where it points is inside the
// roots; a dangling symlink leading out of them is forbidden_path, so the answer never
// depends on whether something outside the roots exists.
func resolveInside(path string, roots []string) (string, error) {
	resolved, err := filepath.EvalSymlinks(path)
	if err == nil {
		if !insideAny(roots, resolved) {
			return "", forbidden(path)
		}
		return resolved, nil
	}
	if !isMissing(err) {
		return "", resolveError(err, path)
	}
	where, lerr := locate(path)
	if lerr != nil {
		return "", resolveError(lerr, path)
	}
	if !insideAny(roots, where) {
		return "", forbidden(path)
	}
	return "", codec.Errorf(codec.CodeFileNotFound, "file not found: %s", path).With("path", path)
}

// locate returns where an absolute path leads, following the symlinks of the components
// that exist (as the kernel would, one component at a time) and appending the first
// missing component and everything after it lexically. It is used only for paths that do
// not exist, to tell "missing inside a root" from "pointing outside".
func locate(path string) (string, error) {
	dest := string(filepath.Separator)
	rest := path
	links := 0
	for rest != "" {
		rest = strings.TrimLeft(rest, string(filepath.Separator))
		name := rest
		if i := strings.IndexByte(rest, filepath.Separator); i >= 0 {
			name, rest = rest[:i], rest[i:]
		} else {
			rest = ""
		}
		switch name {
		case "", ".":
			continue
		case "..":
			dest = filepath.Dir(dest)
			continue
		}
		next := filepath.Join(dest, name)
		fi, err := os.Lstat(next)
		if err != nil {
			if isMissing(err) {
				return filepath.Join(next, rest), nil
			}
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			dest = next
			continue
		}
		if links++; links > maxLinks {
			return "", &fs.PathError{Op: "locate", Path: path, Err: syscall.ELOOP}
		}
		target, err := os.Readlink(next)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			dest = string(filepath.Separator)
		}
		rest = target + string(filepath.Separator) + rest
	}
	return dest, nil
}

// isMissing reports whether err means a path component does not exist (ENOENT, or a
// non-directory used as a directory).
func isMissing(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

// resolveError maps a filesystem error met while resolving or opening path to a code.
func resolveError(err error, path string) error {
	switch {
	case isMissing(err):
		return codec.Errorf(codec.CodeFileNotFound, "file not found: %s", path).With("path", path)
	case errors.Is(err, fs.ErrPermission):
		return codec.Errorf(codec.CodeForbiddenPath, "permission denied: %s", path).With("path", path)
	case errors.Is(err, syscall.ELOOP), strings.Contains(err.Error(), "too many links"):
		return codec.Errorf(codec.CodeBadRequest, "too many levels of symbolic links: %s", path).With("path", path)
	case errors.Is(err, syscall.ENAMETOOLONG):
		return codec.Errorf(codec.CodeBadRequest, "a name in %s is longer than the filesystem allows", path).With("path", path)
	default:
		return codec.Errorf(codec.CodeInternal, "cannot resolve %s: %v", path, err).With("path", path)
	}
}

// forbidden is the one message for every escape, so it never reveals where a link leads.
func forbidden(path string) *codec.Error {
	return codec.Errorf(codec.CodeForbiddenPath, "path %q is outside the allowed roots", path).With("path", path)
}

// outsideRoots is forbidden for a path outside every root as spelled: it names the roots
// (every client reads them in status anyway) and the key that sets them, so a new user
// learns what to change. Escapes through symlinks keep forbidden's one message.
func outsideRoots(path string, roots []string) *codec.Error {
	return codec.Errorf(codec.CodeForbiddenPath, "path %q is outside the allowed roots %q: add its folder to [security] allowed_roots in the gateway's config", path, roots).
		With("path", path).With("allowed_roots", roots)
}

// forbiddenOutput is forbidden for an output path.
func forbiddenOutput(path string) *codec.Error {
	return codec.Errorf(codec.CodeForbiddenPath, "output path %q is outside the output roots (spool_dir, output_roots)", path).With("path", path)
}

// exists refuses an output path at which something already exists.
func exists(path string) *codec.Error {
	return codec.Errorf(codec.CodeForbiddenPath, "output path %q already exists; an output never replaces a file", path).With("path", path)
}

// withPath makes an error from a helper that saw a derived path (a parent directory)
// report the path the client gave.
func withPath(err error, path string) error {
	var ce *codec.Error
	if errors.As(err, &ce) {
		return ce.With("path", path)
	}
	return err
}

// syncs reports whether files written under the output root root are fsynced.
func (p Policy) syncs(root string) bool {
	return slices.Contains(p.SyncRoots, root)
}
