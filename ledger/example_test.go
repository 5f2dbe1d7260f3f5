package ledger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/toolq/toolq/ledger"
)

// Claim before acting; a second claim of the same call finds the outcome.
func ExampleStore_Claim() {
	dir, _ := os.MkdirTemp("", "ledger-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	store, _ := ledger.OpenSQLite(ctx, filepath.Join(dir, "ledger.db"))
	defer store.Close()
	store.Migrate(ctx)

	claim := ledger.Claim{Key: "f59a97883fdd6f13531d0209b36a3446", ConversationID: "conv-42", TurnIndex: 7,
		Tool: "send_payment", ArgsDigest: "…", ToolUseID: "toolu_first", Owner: "worker-1", Lease: 30 * time.Second}
	res, _ := store.Claim(ctx, []ledger.Claim{claim})
	fmt.Println("claimed:", res[0].Claimed, "attempt:", res[0].Row.Attempt)

	// … the tool runs …
	store.Complete(ctx, res[0].Row.Fence(), json.RawMessage(`{"id":"pay_1"}`))

	claim.ToolUseID = "toolu_retry"
	res, _ = store.Claim(ctx, []ledger.Claim{claim})
	fmt.Println("claimed:", res[0].Claimed, "state:", res[0].Row.State, "result:", string(res[0].Row.Result))
	// Output:
	// claimed: true attempt: 1
	// claimed: false state: completed result: {"id":"pay_1"}
}
