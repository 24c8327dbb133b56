package main

// `ortbus cache stats|purge [--model M]`: the result cache's API (docs/PROTOCOL.md,
// Result cache) from the command line; prints the CacheStats as one JSON line.

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/ortbus/ortbus/client"
	"github.com/ortbus/ortbus/codec"
)

const cacheUsage = `usage:
  ortbus cache stats [-s URL] [--model M]   the result cache's entries, bytes and this gateway's hits, misses, evictions
  ortbus cache purge [-s URL] [--model M]   remove the cache's entries (of model M only); prints the figures after
  (each: -inbox-prefix P for a server with per-user inboxes)
`

func cacheCmd(args []string) int {
	if len(args) == 0 || args[0] != "stats" && args[0] != "purge" {
		fmt.Fprint(os.Stderr, cacheUsage)
		return 2
	}
	verb := args[0]
	fs := flag.NewFlagSet("cache "+verb, flag.ContinueOnError)
	url, prefix := natsURL(fs), inboxPrefix(fs)
	model := fs.String("model", "", "only this model's entries")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for the gateway's reply")
	if fs.Parse(args[1:]) != nil || fs.NArg() != 0 {
		fmt.Fprint(os.Stderr, cacheUsage)
		return 2
	}
	c, err := client.Connect(*url, connOpts(*prefix)...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ortbus cache %s: %v\n", verb, err)
		return 1
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var st *codec.CacheStats
	if verb == "purge" {
		st, err = c.PurgeCache(ctx, *model)
	} else {
		st, err = c.CacheStats(ctx, *model)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "ortbus cache %s: %v\n", verb, err)
		return 1
	}
	printJSON(st)
	return 0
}
