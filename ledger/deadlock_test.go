package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/toolq/toolq/ledger"
)

// TestOverlappingBatchesDoNotDeadlock: concurrent batches claim the same
// keys in shuffled orders, then complete what they won in shuffled orders.
// Postgres must not abort any of them as deadlocked; every key is claimed
// once and completed.
func TestOverlappingBatchesDoNotDeadlock(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, s *ledger.Store) {
		ctx := context.Background()
		const rounds, workers, keys = 6, 10, 30
		for round := range rounds {
			claims := make([]ledger.Claim, keys)
			for i := range claims {
				claims[i] = newClaim(time.Minute)
			}
			var mu sync.Mutex
			var failures []string
			won := map[string]int{}
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					batch := append([]ledger.Claim(nil), claims...)
					rand.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
					batch = batch[:keys*2/3]
					res, err := s.Claim(ctx, batch)
					if err != nil {
						mu.Lock()
						failures = append(failures, fmt.Sprintf("round %d worker %d: claim: %v", round, w, err))
						mu.Unlock()
						return
					}
					var cs []ledger.Completion
					for _, r := range res {
						if r.Claimed {
							cs = append(cs, ledger.Completion{Fence: r.Row.Fence(), Output: json.RawMessage(`{}`)})
						}
					}
					rand.Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
					errs, err := s.CompleteBatch(ctx, cs)
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						failures = append(failures, fmt.Sprintf("round %d worker %d: complete: %v", round, w, err))
						return
					}
					for i, c := range cs {
						won[c.Fence.Key]++
						if errs[i] != nil {
							failures = append(failures, fmt.Sprintf("round %d worker %d: complete %s: %v", round, w, c.Fence.Key, errs[i]))
						}
					}
				}()
			}
			wg.Wait()
			if len(failures) > 0 {
				t.Fatalf("%d failures, the first: %s", len(failures), failures[0])
			}
			for k, n := range won {
				if n != 1 {
					t.Fatalf("key %s claimed %d times", k, n)
				}
			}
		}
	})
}
