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

// mappedOut returns the request's out_path as seen on pool's host (see mapped).
func (g *Gateway) mappedOut(p *pending, pool string) (string, bool) {
	return mapPrefix(g.conf().Pool(pool).PathMap, p.req.OutPath)
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

// unmapReply rewrites the paths of a reply of op (msgpack, from pool) from the pool's
// host's view back to the client's: a segment reply's out_path, an infer reply's
// output_paths. data is returned as it is for other ops, when the pool maps no paths, no
// path needs a change, or the reply does not decode (the caller's own decoding reports
// that).
func (g *Gateway) unmapReply(op, pool string, data []byte) []byte {
	pc := g.conf().Pools[pool]
	if pc == nil || len(pc.PathMap) == 0 {
		return data
	}
	var rep any
	changed := false
	switch op {
	case "segment":
		var r codec.SegmentReply
		if err := codec.Unmarshal(data, &r); err != nil {
			return data
		}
		back := unmapPrefix(pc.PathMap, r.OutPath)
		changed, r.OutPath, rep = back != r.OutPath, back, &r
	case "infer":
		var r codec.InferReply
		if err := codec.Unmarshal(data, &r); err != nil {
			return data
		}
		for k, v := range r.OutputPaths {
			if back := unmapPrefix(pc.PathMap, v); back != v {
				r.OutputPaths[k], changed = back, true
			}
		}
		rep = &r
	}
	if !changed {
		return data
	}
	b, err := codec.Marshal(rep)
	if err != nil {
		return data
	}
	return b
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
