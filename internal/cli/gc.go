package cli

import "runtime/debug"

// ServiceGCPercent is the garbage collection target of toolq's
// long-running processes (the consumer, and the naive dispatcher the bench
// compares it with) when GOGC is not set: the heap may grow to five times
// what is live before a collection. A consumer's live heap is small (a few
// MiB: the deliveries in flight), and every delivery allocates a few KiB,
// so that at Go's default (100) the collector ran every few hundred jobs
// and took about a fifth of the consumer's CPU (docs/performance.md); at
// 400 it takes a quarter of that, for some MiB more of resident memory.
// GOGC and GOMEMLIMIT in the environment take precedence, as they do for
// any Go program.
const ServiceGCPercent = 400

// SetServiceGC applies ServiceGCPercent to this process unless the
// environment (getenv) sets GOGC.
func SetServiceGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(ServiceGCPercent)
	}
}
