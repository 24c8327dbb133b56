package codec

import (
	"fmt"
	"math"
	"strings"

	"github.com/ortbus/ortbus/subjects"
)

// Limits on the fields of a request, checked by Validate after decoding (the bounds walk
// of bound.go has already checked lengths, nesting and UTF-8). A field over its limit is
// refused with bad_request naming the field.
const (
	// MaxIDLen bounds a request id, a worker id and every other name from the wire.
	MaxIDLen = subjects.MaxTokenLen
	// MaxPathLen bounds a file path (Linux's PATH_MAX).
	MaxPathLen = 4096
	// MaxTensorPaths bounds the entries of infer's input_paths, and of its output_paths.
	MaxTensorPaths = 64
)

// CheckID checks that id can stand as a request or worker id: 1 to MaxIDLen printable
// ASCII characters, none of them a space, '.', '*' or '>' (so an id is always one valid
// NATS subject token, a safe log value and a safe metrics label).
func CheckID(kind, id string) error {
	if id == "" {
		return fmt.Errorf("%s is empty", kind)
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("%s is %d bytes long, over the limit of %d", kind, len(id), MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case c <= ' ' || c >= 0x7f:
			return fmt.Errorf("%s %q holds a byte that is not printable ASCII", kind, id)
		case !IDByte(c):
			return fmt.Errorf("%s %q holds %q, which a subject token cannot", kind, id, c)
		}
	}
	return nil
}

// IDByte reports whether c may stand in an id (CheckID): printable ASCII, not a space,
// '.', '*' or '>'.
func IDByte(c byte) bool {
	return c > ' ' && c < 0x7f && c != '.' && c != '*' && c != '>'
}

// badField is the bad_request error of one field, with details {field}.
func badField(field, format string, args ...any) error {
	return Errorf(CodeBadRequest, "%s: %s", field, fmt.Sprintf(format, args...)).With("field", field)
}

// field is a named string field of a message, for the checks below.
type field struct{ name, v string }

// checkNames checks names (model, class, pool, device): at most MaxIDLen bytes.
func checkNames(fs ...field) error {
	for _, f := range fs {
		if len(f.v) > MaxIDLen {
			return badField(f.name, "%d bytes long, over the limit of %d", len(f.v), MaxIDLen)
		}
	}
	return nil
}

// checkPaths checks paths: at most MaxPathLen bytes, free of NUL bytes.
func checkPaths(fs ...field) error {
	for _, f := range fs {
		if len(f.v) > MaxPathLen {
			return badField(f.name, "%d bytes long, over the limit of %d", len(f.v), MaxPathLen)
		}
		if strings.IndexByte(f.v, 0) >= 0 {
			return badField(f.name, "holds a NUL byte")
		}
	}
	return nil
}

// checkPathMap checks a map of tensor names to paths (input_paths, output_paths): at most
// MaxTensorPaths entries, names of at most MaxIDLen bytes, paths as checkPaths.
func checkPathMap(name, what string, m map[string]string) error {
	if len(m) > MaxTensorPaths {
		return badField(name, "%d entries, over the limit of %d", len(m), MaxTensorPaths)
	}
	for k, v := range m {
		if len(k) > MaxIDLen {
			return badField(name, "an %s name is %d bytes long, over the limit of %d", what, len(k), MaxIDLen)
		}
		if v == "" {
			return badField(name, "the path of %s %q is empty", what, k)
		}
		if err := checkPaths(field{name, v}); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks a decoded request's fields against the limits above: the id, names
// (model, class, pool, device) no longer than MaxIDLen, paths no longer than MaxPathLen
// and free of NUL bytes, at most MaxTensorPaths input_paths and output_paths, a non-negative timeout, and score thresholds that are numbers
// in [0, 1]. Errors are bad_request with details {field}.
func (r *Request) Validate() error {
	bad := badField
	if r.ID != "" {
		if err := CheckID("id", r.ID); err != nil {
			return bad("id", "%v", err)
		}
	}
	if err := checkNames(field{"model", r.Model}, field{"class", r.Class}, field{"pool", r.Pool}, field{"device", r.Device}); err != nil {
		return err
	}
	if err := checkPaths(field{"path", r.Path}, field{"out_path", r.OutPath}, field{"output_dir", r.OutputDir}); err != nil {
		return err
	}
	if err := checkPathMap("input_paths", "input", r.InputPaths); err != nil {
		return err
	}
	if err := checkPathMap("output_paths", "output", r.OutputPaths); err != nil {
		return err
	}
	if r.OutputDir != "" && len(r.OutputPaths) > 0 {
		return bad("output_paths", "output_dir and output_paths exclude each other")
	}
	if r.TimeoutMS < 0 {
		return bad("timeout_ms", "%d is negative", r.TimeoutMS)
	}
	unit := func(name string, v *float64) error {
		if v != nil && (math.IsNaN(*v) || *v < 0 || *v > 1) {
			return bad(name, "%v is not a number in [0, 1]", *v)
		}
		return nil
	}
	checks := []error{unit("conf", r.Conf), unit("iou", r.IoU)}
	if r.Thresholds != nil {
		checks = append(checks, unit("thresholds.general", r.Thresholds.General), unit("thresholds.character", r.Thresholds.Character))
	}
	for _, err := range checks {
		if err != nil {
			return err
		}
	}
	for _, name := range r.Outputs {
		if len(name) > MaxIDLen {
			return bad("outputs", "an output name is %d bytes long, over the limit of %d", len(name), MaxIDLen)
		}
	}
	for name, t := range r.Inputs {
		if len(name) > MaxIDLen {
			return bad("inputs", "an input name is %d bytes long, over the limit of %d", len(name), MaxIDLen)
		}
		if t == nil {
			return bad("inputs", "input %q is null", name)
		}
	}
	return nil
}

// Validate checks a work item: the request's fields, the op's length and a non-negative
// attempt. (ClaimTo is checked by the worker against the claim subject grammar.)
func (w *WorkItem) Validate() error {
	if err := w.Request.Validate(); err != nil {
		return err
	}
	if len(w.Op) > MaxIDLen {
		return Errorf(CodeBadRequest, "op: %d bytes long, over the limit of %d", len(w.Op), MaxIDLen).With("field", "op")
	}
	if w.Attempt < 0 {
		return Errorf(CodeBadRequest, "attempt: %d is negative", w.Attempt).With("field", "attempt")
	}
	return nil
}
