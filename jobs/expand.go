package jobs

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/images"
)

// Listing is what a directory walk found: the items, sorted, and the entries it left out,
// each with its reason (at most codec.MaxJobSkipsListed listed; SkippedTotal counts all).
type Listing struct {
	Items        []string
	Skipped      []codec.JobSkip
	SkippedTotal int
}

// skip records an entry left out.
func (l *Listing) skip(path, reason string) {
	l.SkippedTotal++
	if len(l.Skipped) < codec.MaxJobSkipsListed {
		l.Skipped = append(l.Skipped, codec.JobSkip{Path: path, Reason: reason})
	}
}

// Test hooks: testHookChecked runs between ExpandAllowed's check of the directory and its
// opening, testHookEnter before each subdirectory (slash-separated, relative) is read:
// the moments a client could swap a directory for a symlink.
var (
	testHookChecked func()
	testHookEnter   func(dir string)
)

// ExpandAllowed lists the images of a directory a client named (the gateway's job.submit
// with dir), as Expand does, confined to the allowed roots of p. The directory must pass
// p's checks (images.Policy.Check: absolute, clean, inside an allowed root as written and
// with its symlinks resolved); it is then opened through an os.Root at the allowed root
// that holds it, and listed through an os.Root at itself. So a directory swapped for a
// symlink after the check cannot lead the listing out of the allowed roots, nor a
// subdirectory swapped during the listing out of the directory: either is refused
// forbidden_path, and nothing outside is listed. Items are named under the directory as
// resolved by the check.
func ExpandAllowed(p images.Policy, d codec.JobDir, max int) (Listing, *codec.Error) {
	if e := checkGlob(d.Glob); e != nil {
		return Listing{}, e
	}
	resolved, err := p.Check(d.Path)
	if err != nil {
		return Listing{}, codec.AsError(err).With("field", "dir.path")
	}
	if testHookChecked != nil {
		testHookChecked()
	}
	r, err := openAllowed(p.AllowedRoots, resolved)
	if err != nil {
		return Listing{}, dirError(d.Path, err, "is outside the allowed roots")
	}
	defer r.Close()
	return walk(r, resolved, d, max)
}

// openAllowed opens dir, a directory resolved inside an allowed root (images.Policy.Check),
// as an os.Root reached through an os.Root at that allowed root: the os.Root follows no
// symlink of the way that leads out of the allowed root, whenever it was put there.
func openAllowed(roots []string, dir string) (*os.Root, error) {
	for _, root := range roots {
		// dir has no symlink left, so it lies lexically under the resolved spelling of
		// the root that holds it. (The roots come from the config, not from the client.)
		if !filepath.IsAbs(root) {
			continue
		}
		resolved, err := filepath.EvalSymlinks(root)
		if err != nil {
			continue
		}
		rel, err := filepath.Rel(resolved, dir)
		if err != nil || !filepath.IsLocal(rel) {
			continue
		}
		ar, err := os.OpenRoot(resolved)
		if err != nil {
			return nil, err
		}
		defer ar.Close()
		return ar.OpenRoot(rel)
	}
	return nil, errOutside // the roots resolve elsewhere than when dir was checked
}

var errOutside = errors.New("outside the allowed roots")

// escapes reports whether err is an os.Root's refusal of a path that leads out of it
// (os does not export that error; images.Policy tells it so too), or errOutside.
func escapes(err error) bool {
	return errors.Is(err, errOutside) || strings.Contains(err.Error(), "path escapes from parent")
}

// Expand lists the images of a directory its caller trusts (the CLI, on its own files;
// the gateway uses ExpandAllowed), sorted, its subdirectories too when recursive: the
// regular files whose base name matches glob, or, when glob is empty, whose content is
// an image format the workers load (images.Sniff: by content, not by name). Every other
// entry is listed in Skipped with its reason. Symlinks inside are not followed (each item is checked where it is read);
// the directory itself may be one, and its items are then named under the directory it
// points to. More than max files is an error. The walk goes through an os.Root at the
// directory, as ExpandAllowed's does.
func Expand(d codec.JobDir, max int) (Listing, *codec.Error) {
	if e := checkGlob(d.Glob); e != nil {
		return Listing{}, e
	}
	base := d.Path
	if resolved, err := filepath.EvalSymlinks(d.Path); err == nil {
		base = resolved
	}
	r, err := os.OpenRoot(base)
	if err != nil {
		return Listing{}, dirError(d.Path, err, "leads outside the directory")
	}
	defer r.Close()
	return walk(r, base, d, max)
}

func checkGlob(glob string) *codec.Error {
	if glob == "" {
		return nil
	}
	if _, err := filepath.Match(glob, ""); err != nil {
		return codec.Errorf(codec.CodeBadRequest, "dir.glob %q: %v", glob, err).With("field", "dir.glob")
	}
	return nil
}

// walk lists the images of the tree of r, named under base.
func walk(r *os.Root, base string, d codec.JobDir, max int) (Listing, *codec.Error) {
	var l Listing
	err := fs.WalkDir(dirFS{r}, ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		full := filepath.Join(base, filepath.FromSlash(p))
		if e.IsDir() {
			if p == "." {
				return nil
			}
			if !d.Recursive {
				l.skip(full, codec.JobSkipDirectory)
				return fs.SkipDir
			}
			if testHookEnter != nil {
				testHookEnter(p)
			}
			return nil
		}
		// An entry is typed as listed (lstat): a symlink is neither a directory entered
		// nor a regular file taken.
		if reason := take(r, p, e, d.Glob); reason != "" {
			l.skip(full, reason)
			return nil
		}
		if len(l.Items) == max {
			return errTooMany
		}
		l.Items = append(l.Items, full)
		return nil
	})
	if errors.Is(err, errTooMany) {
		return Listing{}, codec.Errorf(codec.CodeBadRequest, "%s holds more than %d images (jobs.max_items)", d.Path, max).With("field", "dir")
	}
	if err != nil {
		where := d.Path
		var pe *fs.PathError
		if errors.As(err, &pe) && fs.ValidPath(pe.Path) {
			where = filepath.Join(base, filepath.FromSlash(pe.Path))
		}
		return Listing{}, dirError(where, err, "leads outside the directory being listed")
	}
	return l, nil
}

// take returns "" when the entry p of r is an item, else why not (a codec.JobSkip*
// reason): a symlink or another non-regular file; with a glob, a name it does not match;
// without one, content that is no image (its first bytes, read through r without
// blocking on a file swapped for a FIFO meanwhile).
func take(r *os.Root, p string, e fs.DirEntry, glob string) string {
	switch {
	case e.Type()&fs.ModeSymlink != 0:
		return codec.JobSkipSymlink
	case !e.Type().IsRegular():
		return codec.JobSkipNotRegular
	case glob != "":
		if ok, _ := filepath.Match(glob, e.Name()); !ok {
			return codec.JobSkipGlob
		}
		return ""
	}
	f, err := r.OpenFile(filepath.FromSlash(p), os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return codec.JobSkipUnreadable
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return codec.JobSkipNotRegular
	}
	head := make([]byte, images.SniffLen)
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return codec.JobSkipUnreadable
	}
	if images.Sniff(head[:n]) == "" {
		return codec.JobSkipNotImage
	}
	return ""
}

var errTooMany = errors.New("too many files")

// dirError is the answer when a directory to list (or one below it, path) cannot be
// read: forbidden_path where the os.Root refused a way out (escape says how) or access
// is denied, file_not_found where it is missing, bad_request otherwise (not a directory,
// a read error).
func dirError(path string, err error, escape string) *codec.Error {
	switch {
	case escapes(err):
		return codec.Errorf(codec.CodeForbiddenPath, "path %q %s", path, escape).With("path", path).With("field", "dir")
	case errors.Is(err, fs.ErrPermission):
		return codec.Errorf(codec.CodeForbiddenPath, "permission denied: %s", path).With("path", path).With("field", "dir")
	case errors.Is(err, fs.ErrNotExist):
		return codec.Errorf(codec.CodeFileNotFound, "directory %s does not exist", path).With("field", "dir")
	case errors.Is(err, syscall.ENOTDIR):
		return codec.Errorf(codec.CodeBadRequest, "%s is not a directory", path).With("field", "dir")
	}
	return codec.Errorf(codec.CodeBadRequest, "read directory %s: %v", path, err).With("field", "dir")
}

// dirFS is an os.Root's tree for fs.WalkDir, whose directories it opens with O_DIRECTORY:
// an entry listed as a directory and then swapped for a FIFO fails at once instead of
// blocking the walk in open(2). (os.Root's own FS opens them as plain files.)
type dirFS struct{ r *os.Root }

func (f dirFS) Open(name string) (fs.File, error) { return f.r.FS().Open(name) }

func (f dirFS) ReadDir(name string) ([]fs.DirEntry, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrInvalid}
	}
	dir, err := f.r.OpenFile(name, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	entries, err := dir.ReadDir(-1)
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return entries, err
}
