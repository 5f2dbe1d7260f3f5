package mcpfront_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/mcpfront"
)

// TestATurnIndexAbove2To53IsRefusedNotRoundedIntoAnotherTurn: _meta is
// decoded into doubles, in which 2^53+1 is 2^53; a turn index is taken
// up to 2^53−1, so a later turn is never taken for an earlier one (a
// deliberate second payment swallowed).
func TestATurnIndexAbove2To53IsRefusedNotRoundedIntoAnotherTurn(t *testing.T) {
	t.Parallel()
	b := setup(t, sandbox.Faults{})
	cs := connect(t, b.addr)
	const big = int64(1) << 53
	one := mustCall(t, cs, "send_payment", payment("inv_2p53"), mcp.Meta{mcpfront.MetaConversationID: "conv-2p53", mcpfront.MetaTurnIndex: big - 1})
	if one.IsError {
		t.Fatal(asJSON(t, one))
	}
	for _, turn := range []int64{big, big + 1} {
		res, err := call(context.Background(), cs, "send_payment", payment("inv_2p53"), mcp.Meta{mcpfront.MetaConversationID: "conv-2p53", mcpfront.MetaTurnIndex: turn})
		var rpc *jsonrpc.Error
		if errors.As(err, &rpc) && rpc.Code == jsonrpc.CodeInvalidParams && strings.Contains(rpc.Message, "2^53−1") {
			continue // refused: fine
		}
		t.Fatalf("turn %d was not refused: %v, key %s (turn %d's key %s), %d payment(s)", turn, err, key(res), big-1, key(one), b.payments("inv_2p53"))
	}
}

// TestAMisspelledToolqMetaFieldIsRefusedNotIgnored: an io.toolq/ name in
// _meta that is none of the three toolq reads (io.toolq/Ordinal,
// io.toolq/ordinal_index) is refused, naming it: ignored, a misspelt
// ordinal would be 0, and a deliberate second identical call of the turn
// would be answered with the first's result and never run.
func TestAMisspelledToolqMetaFieldIsRefusedNotIgnored(t *testing.T) {
	t.Parallel()
	b := setup(t, sandbox.Faults{})
	cs := connect(t, b.addr)
	first := mustCall(t, cs, "send_payment", payment("inv_typo"), named("conv-typo", 1))
	if first.IsError {
		t.Fatal(asJSON(t, first))
	}
	for _, name := range []string{"io.toolq/Ordinal", "io.toolq/ordinal_index", "IO.TOOLQ/ordinal"} {
		meta := named("conv-typo", 1)
		meta[name] = 1
		_, err := call(context.Background(), cs, "send_payment", payment("inv_typo"), meta)
		var rpc *jsonrpc.Error
		if !errors.As(err, &rpc) || rpc.Code != jsonrpc.CodeInvalidParams || !strings.Contains(rpc.Message, name) || !strings.Contains(rpc.Message, mcpfront.MetaOrdinal) {
			t.Fatalf("an unknown io.toolq/ field %s was ignored (%v): %d payment(s) for 2 intended", name, err, b.payments("inv_typo"))
		}
	}
}
