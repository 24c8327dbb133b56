package gateway

import (
	"maps"
	"slices"
	"strings"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
)

// A pool's path_map maps path prefixes as the clients (and this gateway) see them to
// prefixes on the pool's host. Requests' paths (path, out_path, and infer's input_paths,
// output_dir and output_paths) are mapped on the way to the pool, and paths in replies (a
// segment reply's out_path, an infer reply's output_paths) back on the way to the client.

// under reports whether path is prefix or lies below it, component-wise (/srv/img2 is not
// under /srv/img), and returns the rest of path after prefix: "" or starting with "/".
func under(path, prefix string) (string, bool) {
	prefix = strings.TrimRight(prefix, "/")
	switch {
	case path == prefix:
		return "", true
	case strings.HasPrefix(path, prefix+"/"):
		return path[len(prefix):], true
	}
	return "", false
}

// joinPrefix puts rest (from under) after prefix.
func joinPrefix(prefix, rest string) string {
	if p := strings.TrimRight(prefix, "/") + rest; p != "" {
		return p
	}
	return "/"
}

// mapPrefix rewrites path by the longest `from` prefix of m that it is under, to that
// prefix's `to`. An empty m or path is returned unchanged; false means no prefix matches.
func mapPrefix(m map[string]string, path string) (string, bool) {
	if len(m) == 0 || path == "" {
		return path, true
	}
	best, bestRest, found := "", "", false
	for from := range m {
		rest, ok := under(path, from)
		if !ok {
			continue
		}
		n, bn := len(strings.TrimRight(from, "/")), len(strings.TrimRight(best, "/"))
		if !found || n > bn || (n == bn && from < best) {
			best, bestRest, found = from, rest, true
		}
	}
	if !found {
		return "", false
	}
	return joinPrefix(m[best], bestRest), true
}

// unmapPrefix is mapPrefix backwards: path (as the pool's host sees it) rewritten by the
// longest `to` prefix of m that it is under, back to its `from` (the smallest `from`
// when several map to that `to`). A path under no `to` is returned unchanged.
func unmapPrefix(m map[string]string, path string) string {
	if len(m) == 0 || path == "" {
		return path
	}
	bestFrom, bestTo, bestRest, found := "", "", "", false
	for from, to := range m {
		rest, ok := under(path, to)
		if !ok {
			continue
		}
		n, bn := len(strings.TrimRight(to, "/")), len(strings.TrimRight(bestTo, "/"))
		if !found || n > bn || (n == bn && from < bestFrom) {
			bestFrom, bestTo, bestRest, found = from, to, rest, true
		}
	}
	if !found {
		return path
	}
	return joinPrefix(bestFrom, bestRest)
}

// mapRequest rewrites every path of r by m (mapPrefix): path, out_path, output_dir and
// the values of input_paths and output_paths. The maps are replaced by new ones, never
// changed, so r may be a shallow copy of a request that other pools map their own way.
// When a path is under no prefix of m it stops and returns false with the field (e.g.
// input_paths.x) and its path; fields are tried in a fixed order, map keys sorted.
func mapRequest(m map[string]string, r *codec.Request) (field, path string, ok bool) {
	if len(m) == 0 {
		return "", "", true
	}
	for _, f := range []struct {
		name string
		v    *string
	}{{"path", &r.Path}, {"out_path", &r.OutPath}, {"output_dir", &r.OutputDir}} {
		mp, ok := mapPrefix(m, *f.v)
		if !ok {
			return f.name, *f.v, false
		}
		*f.v = mp
	}
	for _, f := range []struct {
		name string
		v    *map[string]string
	}{{"input_paths", &r.InputPaths}, {"output_paths", &r.OutputPaths}} {
		if len(*f.v) == 0 {
			continue
		}
		out := make(map[string]string, len(*f.v))
		for _, k := range slices.Sorted(maps.Keys(*f.v)) {
			mp, ok := mapPrefix(m, (*f.v)[k])
			if !ok {
				return f.name + "." + k, (*f.v)[k], false
			}
			out[k] = mp
		}
		*f.v = out
	}
	return "", "", true
}

// unmapPaths rewrites the output paths of a decoded reply (a segment reply's out_path,
// an infer reply's output_paths) from a pool's host's view (its path_map m) back to the
// client's, and reports whether any changed. Other replies are left as they are.
func unmapPaths(m map[string]string, rep any) (changed bool) {
	if len(m) == 0 {
		return false
	}
	switch r := rep.(type) {
	case *codec.SegmentReply:
		back := unmapPrefix(m, r.OutPath)
		changed, r.OutPath = back != r.OutPath, back
	case *codec.InferReply:
		for k, v := range r.OutputPaths {
			if back := unmapPrefix(m, v); back != v {
				r.OutputPaths[k], changed = back, true
			}
		}
	}
	return changed
}

// mappedByAny reports whether one of pools has a path_map prefix that path lies under:
// such a pool reads path on its own host, under that host's roots.
func mappedByAny(c *config.Config, pools []string, path string) bool {
	for _, pool := range pools {
		if m := c.Pool(pool).PathMap; len(m) > 0 {
			if _, ok := mapPrefix(m, path); ok {
				return true
			}
		}
	}
	return false
}
