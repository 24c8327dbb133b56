package codec

// The result cache's API (ortbus.v1.cache.<verb>; package cache, gateway/cache.go).

// CacheRequest is the body of cache.stats and cache.purge: Model limits a purge (and the
// entries counted by stats) to one model's entries; empty: every model.
type CacheRequest struct {
	Model string `msgpack:"model,omitempty" json:"model,omitempty"`
}

// Validate checks a cache request from the wire.
func (r *CacheRequest) Validate() error { return checkNames(field{"model", r.Model}) }

// CacheStats answers cache.stats (and cache.purge, after purging): the bucket's figures
// and this gateway's counters since it started.
type CacheStats struct {
	// Enabled: the gateway has a cache ([cache] enabled, and JetStream open).
	Enabled bool `msgpack:"enabled" json:"enabled"`
	// Entries and Bytes are what the bucket holds (all owners: the local owner; with a
	// Model, that model's entries), MaxBytes its bound.
	Entries  uint64 `msgpack:"entries" json:"entries"`
	Bytes    uint64 `msgpack:"bytes" json:"bytes"`
	MaxBytes int64  `msgpack:"max_bytes" json:"max_bytes"`
	// This gateway's counters: hits, misses (looked up, not found or unusable), corrupt
	// entries (read as misses), writes, evictions (entries dropped for room), the files
	// stat'ed and hashed and the time each took.
	Hits      uint64  `msgpack:"hits" json:"hits"`
	Misses    uint64  `msgpack:"misses" json:"misses"`
	Corrupt   uint64  `msgpack:"corrupt" json:"corrupt"`
	Writes    uint64  `msgpack:"writes" json:"writes"`
	Evictions uint64  `msgpack:"evictions" json:"evictions"`
	Stats     uint64  `msgpack:"stats" json:"stats"`
	Hashed    uint64  `msgpack:"hashed" json:"hashed"`
	StatMS    float64 `msgpack:"stat_ms" json:"stat_ms"`
	HashMS    float64 `msgpack:"hash_ms" json:"hash_ms"`
	HashBytes uint64  `msgpack:"hash_bytes" json:"hash_bytes"`
	// Purged is how many entries a cache.purge removed.
	Purged uint64 `msgpack:"purged,omitempty" json:"purged,omitempty"`
}
