package ledger_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/toolq/toolq/ledger"
)

// BenchmarkClaimComplete measures claim+complete per row: one row per round
// trip, and 100 rows per claim batch and per completion batch, as the
// consumer does with a fetched batch. ns/op is per row in both.
func BenchmarkClaimComplete(b *testing.B) {
	for _, backend := range []string{"postgres", "sqlite"} {
		b.Run(backend, func(b *testing.B) {
			s := openBenchStore(b, backend)
			output := json.RawMessage(`{"id":"pay_123","status":"succeeded"}`)
			b.Run("single", func(b *testing.B) {
				ctx := context.Background()
				for b.Loop() {
					res, err := s.Claim(ctx, []ledger.Claim{newClaim(time.Minute)})
					if err != nil || !res[0].Claimed {
						b.Fatal(err)
					}
					if err := s.Complete(ctx, res[0].Row.Fence(), output); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("batched-100", func(b *testing.B) {
				ctx := context.Background()
				claims := make([]ledger.Claim, 100)
				completions := make([]ledger.Completion, 100)
				rows := 0
				for b.Loop() {
					if rows%100 == 0 {
						for i := range claims {
							claims[i] = newClaim(time.Minute)
						}
						res, err := s.Claim(ctx, claims)
						if err != nil {
							b.Fatal(err)
						}
						for i, r := range res {
							if !r.Claimed {
								b.Fatalf("not claimed: %+v", r)
							}
							completions[i] = ledger.Completion{Fence: r.Row.Fence(), Output: output}
						}
						errs, err := s.CompleteBatch(ctx, completions)
						if err != nil {
							b.Fatal(err)
						}
						for _, err := range errs {
							if err != nil {
								b.Fatal(err)
							}
						}
					}
					rows++
				}
			})
		})
	}
}

func openBenchStore(b *testing.B, backend string) *ledger.Store { return openStoreTB(b, backend) }

// BenchmarkCompleteBatch is the completion of a batch of 16 claims (a busy
// worker's group commit), per batch.
func BenchmarkCompleteBatch(b *testing.B) {
	for _, backend := range []string{"postgres", "sqlite"} {
		b.Run(backend, func(b *testing.B) {
			s := openBenchStore(b, backend)
			ctx := context.Background()
			output := json.RawMessage(`{"id":"pay_123","status":"succeeded"}`)
			claims := make([]ledger.Claim, 16)
			completions := make([]ledger.Completion, 16)
			for b.Loop() {
				b.StopTimer()
				for i := range claims {
					claims[i] = newClaim(time.Minute)
				}
				res, err := s.Claim(ctx, claims)
				if err != nil {
					b.Fatal(err)
				}
				for i, r := range res {
					completions[i] = ledger.Completion{Fence: r.Row.Fence(), Output: output}
				}
				b.StartTimer()
				errs, err := s.CompleteBatch(ctx, completions)
				if err != nil || errs[0] != nil {
					b.Fatal(err, errs)
				}
			}
		})
	}
}

// BenchmarkDuplicateClaim is the claim of a settled key, as a duplicate
// delivery makes it (the row comes back, nothing is claimed), per claim.
func BenchmarkDuplicateClaim(b *testing.B) {
	for _, backend := range []string{"postgres", "sqlite"} {
		b.Run(backend, func(b *testing.B) {
			s := openBenchStore(b, backend)
			ctx := context.Background()
			c := newClaim(time.Minute)
			res, err := s.Claim(ctx, []ledger.Claim{c})
			if err != nil || !res[0].Claimed {
				b.Fatal(err)
			}
			if err := s.Complete(ctx, res[0].Row.Fence(), json.RawMessage(`{}`)); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				res, err := s.Claim(ctx, []ledger.Claim{c})
				if err != nil || res[0].Claimed || res[0].Row.State != ledger.Completed {
					b.Fatal(err, res)
				}
			}
		})
	}
}

// BenchmarkClaimDuplicates is the claim of a batch of 16 keys whose calls
// completed (a retried turn's duplicates, as a busy worker batches them),
// per batch: the duplicate path's one ledger round trip.
func BenchmarkClaimDuplicates(b *testing.B) {
	for _, backend := range []string{"postgres", "sqlite"} {
		b.Run(backend, func(b *testing.B) {
			s := openBenchStore(b, backend)
			ctx := context.Background()
			output := json.RawMessage(`{"id":"pay_123","status":"succeeded"}`)
			claims := make([]ledger.Claim, 16*64)
			for i := range claims {
				claims[i] = newClaim(time.Minute)
				res, err := s.Claim(ctx, claims[i:i+1])
				if err != nil || !res[0].Claimed {
					b.Fatal(err)
				}
				if err := s.Complete(ctx, res[0].Row.Fence(), output); err != nil {
					b.Fatal(err)
				}
			}
			i := 0
			for b.Loop() {
				batch := claims[i*16 : i*16+16]
				i = (i + 1) % 64
				res, err := s.Claim(ctx, batch)
				if err != nil {
					b.Fatal(err)
				}
				for _, r := range res {
					if r.Claimed || r.Row.State != ledger.Completed {
						b.Fatalf("not a duplicate: %+v", r)
					}
				}
			}
		})
	}
}
