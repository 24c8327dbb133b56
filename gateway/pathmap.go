package gateway

import (
	"strings"

	"github.com/ortbus/ortbus/codec"
)

// A pool's path_map maps path prefixes as the clients (and this gateway) see them to
// prefixes on the pool's host. Requests' paths (path, out_path) are mapped on the way to
// the pool, and paths in replies (a segment reply's out_path) back on the way to the
// client.

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
	return mapPrefix(g.cfg.Pools[pool].PathMap, p.req.OutPath)
}

// unmapReply rewrites the out_path of a segment reply (msgpack, from pool) from the
// pool's host's view back to the client's. data is returned as it is when the pool maps
// no paths, the path needs no change, or the reply does not decode (the caller's own
// decoding reports that).
func (g *Gateway) unmapReply(pool string, data []byte) []byte {
	pc := g.cfg.Pools[pool]
	if pc == nil || len(pc.PathMap) == 0 {
		return data
	}
	var rep codec.SegmentReply
	if err := codec.Unmarshal(data, &rep); err != nil {
		return data
	}
	back := unmapPrefix(pc.PathMap, rep.OutPath)
	if back == rep.OutPath {
		return data
	}
	rep.OutPath = back
	b, err := codec.Marshal(&rep)
	if err != nil {
		return data
	}
	return b
}
