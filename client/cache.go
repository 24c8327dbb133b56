package client

import (
	"context"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/subjects"
)

// CacheStats reads the result cache's figures (model: that model's entries only).
func (c *Client) CacheStats(ctx context.Context, model string) (*codec.CacheStats, error) {
	var r codec.CacheStats
	return &r, c.do(ctx, subjects.OpCacheStats, &codec.CacheRequest{Model: model}, &r)
}

// PurgeCache removes the caller's entries of the result cache (model: that model's
// only; the local owner removes every owner's) and returns the figures after.
func (c *Client) PurgeCache(ctx context.Context, model string) (*codec.CacheStats, error) {
	var r codec.CacheStats
	return &r, c.do(ctx, subjects.OpCachePurge, &codec.CacheRequest{Model: model}, &r)
}
