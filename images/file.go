package images

import "os"

// OpenFile opens an image path for reading its bytes as they are, under the checks of
// Open (absolute, clean, inside an allowed root as written and with its symlinks
// resolved, a regular file, opened through an os.Root at its allowed root), without
// reading or decoding it: the result cache hashes the file's bytes with it. It returns
// the file and its resolved path. Errors are Open's *codec.Error.
func (p Policy) OpenFile(path string) (*os.File, string, error) {
	roots, err := p.admit(path)
	if err != nil {
		return nil, "", err
	}
	resolved, err := resolveInside(path, roots)
	if err != nil {
		return nil, "", err
	}
	f, err := openRegular(resolved, rootOf(roots, resolved), path, kindImage)
	if err != nil {
		return nil, "", err
	}
	return f, resolved, nil
}

// MaxFileBytes is the policy's file size limit (MaxBytes, else DefaultMaxBytes).
func (p Policy) MaxFileBytes() int64 { return p.maxBytes() }
