//go:build !(linux && cgo)

package worker

// trimC does nothing without cgo on Linux: the peak is measured past the free memory the
// C heap keeps.
func trimC() {}
