// Package docs holds ortbus's documents: PROTOCOL.md (the contract between the parts and
// their clients) and BENCHMARKS.md. Its test keeps PROTOCOL.md in step with the code:
// every error code, client op, class, policy and message field must appear in it.
package docs
