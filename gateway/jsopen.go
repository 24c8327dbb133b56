package gateway

import (
	"context"
	"log/slog"
	"time"
)

// Opening what the gateway keeps on JetStream (the job store, the answers bucket) while
// JetStream may not be ready: a cluster that has not elected its meta leader yet does not
// answer a JetStream API request at all — the request is not refused, it is lost, and
// the caller learns nothing until its own deadline. So:
//
//  1. An attempt is bounded, and the first bound is short (jsOpenAttempt): a request lost
//     to a cluster still electing costs that bound, not the 30 s that one attempt was
//     given before (the job API answered unavailable for 30 s after a cluster's start,
//     and TestClusterMultiHost/Job waited that long, about one run in two).
//  2. A bound that runs out doubles for the next attempt, up to jsOpenAttemptMax: a
//     legitimately slow step (a replicated stream placed on a loaded cluster) gets the
//     time it needs. Every step of an open is idempotent (create or update), so an attempt
//     cut short leaves nothing the next one trips on.
//  3. Between attempts the pause grows from jobOpenRetry to jobOpenRetryMax, and a failure
//     is logged once per kind of error.
const (
	jsOpenAttempt    = 2 * time.Second
	jsOpenAttemptMax = 30 * time.Second
)

// jsOpener holds the bounds of rules 1–3 (the constants; tests set their own).
type jsOpener struct {
	attempt, attemptMax time.Duration
	wait, waitMax       time.Duration
}

var defaultJSOpener = jsOpener{attempt: jsOpenAttempt, attemptMax: jsOpenAttemptMax, wait: jobOpenRetry, waitMax: jobOpenRetryMax}

// open calls try, each call under its attempt's bound, until it succeeds (true) or ctx
// ends (false). failed is called after each failed attempt, before the pause (the job
// store marks its API unavailable there); what names the thing in the log.
func (o jsOpener) open(ctx context.Context, log *slog.Logger, what string, try func(ctx context.Context) error, failed func(err error)) bool {
	bound, wait, lastErr := o.attempt, o.wait, ""
	for {
		actx, cancel := context.WithTimeout(ctx, bound)
		err := try(actx)
		timedOut := actx.Err() != nil
		cancel()
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if failed != nil {
			failed(err)
		}
		if msg := err.Error(); msg != lastErr { // rule 3: once per kind of failure
			log.Warn("open the "+what+"; trying again", "err", err, "attempt_bound", bound, "every", o.waitMax)
			lastErr = msg
		}
		if timedOut { // rule 2
			bound = min(2*bound, o.attemptMax)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait = min(2*wait, o.waitMax)
	}
}
