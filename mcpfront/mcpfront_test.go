package mcpfront_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/mcpfront"
)

func TestTheRegistryIsListedWithItsClasses(t *testing.T) {
	t.Parallel()
	b := setup(t, sandbox.Faults{})
	cs := connect(t, b.addr)
	list, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*mcp.Tool{}
	for _, tool := range list.Tools {
		got[tool.Name] = tool
	}
	for name, class := range map[string]string{"send_payment": "keyed_write", "create_ticket": "unkeyed_write", "search_orders": "read"} {
		tool, ok := got[name]
		switch {
		case !ok:
			t.Fatalf("%s is not listed: %v", name, list.Tools)
		case tool.Annotations == nil || tool.Annotations.ReadOnlyHint != (class == "read"):
			t.Errorf("%s: annotations %+v, want readOnlyHint %v", name, tool.Annotations, class == "read")
		case tool.Meta[mcpfront.MetaClass] != class:
			t.Errorf("%s: _meta %v, want class %s", name, tool.Meta, class)
		case tool.InputSchema.(map[string]any)["type"] != "object":
			t.Errorf("%s: input schema %v", name, tool.InputSchema)
		}
	}
}

func TestAReadWithoutMetaRuns(t *testing.T) {
	t.Parallel()
	b := setup(t, sandbox.Faults{})
	cs := connect(t, b.addr)
	res := mustCall(t, cs, "search_orders", map[string]any{"query": "inv_"}, nil)
	if res.IsError || status(res) != "ok" || !strings.Contains(text(t, res), `"query":"inv_"`) {
		t.Fatalf("read: isError %v, _meta %v, %s", res.IsError, res.Meta, text(t, res))
	}
	if res.StructuredContent == nil {
		t.Errorf("an object output is also the structured content")
	}
	if key(res) != "" {
		t.Errorf("a read run without a job has a key: %v", res.Meta)
	}
	// Named, a read is a job like any call.
	asJob := mustCall(t, cs, "search_orders", map[string]any{"query": "inv_"}, named("conv-read", 1))
	if asJob.IsError || status(asJob) != "ok" || len(key(asJob)) != jobs.KeyLen {
		t.Fatalf("named read: isError %v, _meta %v", asJob.IsError, asJob.Meta)
	}
}

func TestAWriteWithoutMetaIsRefusedNamingTheFields(t *testing.T) {
	t.Parallel()
	b := setup(t, sandbox.Faults{})
	cs := connect(t, b.addr)
	for _, meta := range []mcp.Meta{nil, {mcpfront.MetaOrdinal: 1}} {
		_, err := call(context.Background(), cs, "send_payment", payment("inv_unnamed"), meta)
		var rpc *jsonrpc.Error
		if !errors.As(err, &rpc) || rpc.Code != jsonrpc.CodeInvalidParams {
			t.Fatalf("_meta %v: want an invalid-params error, got %v", meta, err)
		}
		for _, want := range []string{mcpfront.MetaConversationID, mcpfront.MetaTurnIndex} {
			if !strings.Contains(rpc.Message, want) {
				t.Errorf("_meta %v: the refusal does not name %s: %s", meta, want, rpc.Message)
			}
		}
	}
	if n := b.payments("inv_unnamed"); n != 0 {
		t.Fatalf("a refused call paid %d times", n)
	}
	// An unkeyed write likewise.
	if _, err := call(context.Background(), cs, "create_ticket", ticket("unnamed"), nil); err == nil || !strings.Contains(err.Error(), mcpfront.MetaTurnIndex) {
		t.Fatalf("create_ticket without _meta: %v", err)
	}
	if n := b.tickets("unnamed"); n != 0 {
		t.Fatalf("a refused call made %d tickets", n)
	}
}

func TestAMetaThatNamesTheCallWronglyIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, sandbox.Faults{})
	cs := connect(t, b.addr)
	for _, tc := range []struct {
		meta mcp.Meta
		want string
	}{
		{mcp.Meta{mcpfront.MetaConversationID: "c1"}, `without "io.toolq/turn_index"`},
		{mcp.Meta{mcpfront.MetaTurnIndex: 1}, `without "io.toolq/conversation_id"`},
		{mcp.Meta{mcpfront.MetaConversationID: "c1", mcpfront.MetaTurnIndex: "1"}, `"io.toolq/turn_index": must be an integer from 0 to 2^53−1, got "1"`},
		{mcp.Meta{mcpfront.MetaConversationID: "c1", mcpfront.MetaTurnIndex: -1}, `"io.toolq/turn_index": must be an integer from 0 to 2^53−1, got -1`},
		{mcp.Meta{mcpfront.MetaConversationID: "c1", mcpfront.MetaTurnIndex: 1.5}, `got 1.5`},
		{mcp.Meta{mcpfront.MetaConversationID: "c1", mcpfront.MetaTurnIndex: 1 << 60}, `"io.toolq/turn_index": must be an integer from 0 to 2^53−1`},
		{mcp.Meta{mcpfront.MetaConversationID: "c1", mcpfront.MetaTurnIndex: 1, mcpfront.MetaOrdinal: "0"}, `"io.toolq/ordinal": must be an integer from 0 to 2^53−1`},
		{mcp.Meta{mcpfront.MetaConversationID: 7, mcpfront.MetaTurnIndex: 1}, `"io.toolq/conversation_id": must be a string, got 7`},
		{mcp.Meta{mcpfront.MetaConversationID: "c|1", mcpfront.MetaTurnIndex: 1}, `"io.toolq/conversation_id": must match ^[A-Za-z0-9_:-]{1,128}$`},
	} {
		// A read is refused too: a _meta that tries to name a call and
		// fails is a client to correct, not a read to run unnamed.
		for _, tool := range []string{"send_payment", "search_orders"} {
			args := payment("inv_badmeta")
			if tool == "search_orders" {
				args = map[string]any{"query": "x"}
			}
			_, err := call(context.Background(), cs, tool, args, tc.meta)
			var rpc *jsonrpc.Error
			if !errors.As(err, &rpc) || rpc.Code != jsonrpc.CodeInvalidParams || !strings.Contains(rpc.Message, tc.want) {
				t.Errorf("%s with _meta %v: want an invalid-params error saying %q, got %v", tool, tc.meta, tc.want, err)
			}
		}
	}
	if n := b.payments("inv_badmeta"); n != 0 {
		t.Fatalf("a refused call paid %d times", n)
	}
}

func TestAWriteRunsOnceAndItsReissueGetsTheSameResult(t *testing.T) {
	t.Parallel()
	b := setup(t, sandbox.Faults{})
	first := connect(t, b.addr)
	res := mustCall(t, first, "send_payment", payment("inv_once"), named("conv-once", 3))
	if res.IsError || status(res) != "ok" || len(key(res)) != jobs.KeyLen {
		t.Fatalf("payment: isError %v, _meta %v, %s", res.IsError, res.Meta, text(t, res))
	}
	// The key is the one every client derives for this call.
	want, err := jobs.Call{ConversationID: "conv-once", TurnIndex: 3, Tool: "send_payment",
		Args: []byte(`{"invoice_id":"inv_once","amount_cents":500,"currency":"EUR"}`)}.Key()
	if err != nil || key(res) != want {
		t.Fatalf("key %s, want %s (%v)", key(res), want, err)
	}
	// Re-issued with a new request ID, on a new session, the args spelled
	// in another order: the stored result, no second effect.
	again := mustCall(t, connect(t, b.addr), "send_payment",
		map[string]any{"currency": "EUR", "amount_cents": 500.0, "invoice_id": "inv_once"}, named("conv-once", 3))
	if asJSON(t, again) != asJSON(t, res) {
		t.Fatalf("re-issue answered\n%s\nnot\n%s", asJSON(t, again), asJSON(t, res))
	}
	if n := b.payments("inv_once"); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}

	// A write whose downstream has no dedupe of its own: only toolq stands
	// between a re-issue and a second ticket.
	tk := mustCall(t, first, "create_ticket", ticket("once"), named("conv-once", 4))
	tk2 := mustCall(t, first, "create_ticket", ticket("once"), named("conv-once", 4))
	if tk.IsError || asJSON(t, tk2) != asJSON(t, tk) {
		t.Fatalf("ticket %s, re-issue %s", asJSON(t, tk), asJSON(t, tk2))
	}
	if n := b.tickets("once"); n != 1 {
		t.Fatalf("%d tickets, want 1", n)
	}
}

func TestTheSameCallInALaterTurnIsASecondPayment(t *testing.T) {
	t.Parallel()
	b := setup(t, sandbox.Faults{})
	cs := connect(t, b.addr)
	one := mustCall(t, cs, "send_payment", payment("inv_twice"), named("conv-twice", 1))
	two := mustCall(t, cs, "send_payment", payment("inv_twice"), named("conv-twice", 2))
	if one.IsError || two.IsError || key(one) == key(two) {
		t.Fatalf("turn 1 %s, turn 2 %s", asJSON(t, one), asJSON(t, two))
	}
	// So is an identical call of the same turn with the next ordinal.
	meta := named("conv-twice", 2)
	meta[mcpfront.MetaOrdinal] = 1
	three := mustCall(t, cs, "send_payment", payment("inv_twice"), meta)
	if three.IsError || key(three) == key(two) {
		t.Fatalf("ordinal 1 %s", asJSON(t, three))
	}
	if n := b.payments("inv_twice"); n != 3 {
		t.Fatalf("%d payments, want 3", n)
	}
}

// TestACallWhoseStreamIsCutAndReissuedPaysOnce cuts the response stream of
// a tools/call after the request was sent, as a network failure does; the
// client re-issues the call as the specification says (a new request,
// with a new ID, here on a new session).
func TestACallWhoseStreamIsCutAndReissuedPaysOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, sandbox.Faults{})
	for _, tc := range []struct {
		name string
		cut  func(p *testenv.CutProxy)
		// acted: the cut call took effect before its re-issue (the
		// server never learned of the cut)
		acted bool
	}{
		{"the response is lost on its way", func(p *testenv.CutProxy) { p.CutResponse(`"tools/call"`) }, true},
		{"the connection is cut both ways", func(p *testenv.CutProxy) { p.CutBoth(`"tools/call"`) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			invoice, conv := "inv_cut_"+strings.ReplaceAll(tc.name, " ", "_"), "conv-cut-"+strings.ReplaceAll(tc.name, " ", "-")
			proxy := testenv.StartCutProxy(t, b.addr)
			tc.cut(proxy)
			if _, err := call(context.Background(), connect(t, proxy.Addr()), "send_payment", payment(invoice), named(conv, 1)); err == nil {
				t.Fatal("the cut call answered")
			}
			if proxy.Cuts() != 1 {
				t.Fatalf("%d cuts", proxy.Cuts())
			}
			if tc.acted {
				testenv.Eventually(t, 30*time.Second, "the cut call's payment", func() bool { return b.payments(invoice) == 1 })
			}
			res := mustCall(t, connect(t, proxy.Addr()), "send_payment", payment(invoice), named(conv, 1))
			again := mustCall(t, connect(t, proxy.Addr()), "send_payment", payment(invoice), named(conv, 1))
			if res.IsError || asJSON(t, again) != asJSON(t, res) {
				t.Fatalf("re-issue %s, again %s", asJSON(t, res), asJSON(t, again))
			}
			if n := b.payments(invoice); n != 1 {
				t.Fatalf("%d payments, want 1", n)
			}
		})
	}
}

func TestAnUnkeyedWriteWhoseOutcomeIsUnknownSaysWhoDecides(t *testing.T) {
	t.Parallel()
	// Every write takes effect and its answer is lost.
	b := setup(t, sandbox.Faults{DropAfterEffectRate: 1})
	cs := connect(t, b.addr)
	res := mustCall(t, cs, "create_ticket", ticket("lost"), named("conv-lost", 1))
	if !res.IsError || status(res) != "indeterminate" || !strings.Contains(text(t, res), "consumer ledger resolve "+key(res)) {
		t.Fatalf("isError %v, _meta %v, %s", res.IsError, res.Meta, text(t, res))
	}
	// Asked again, it is not run again.
	again := mustCall(t, connect(t, b.addr), "create_ticket", ticket("lost"), named("conv-lost", 1))
	if status(again) != "indeterminate" {
		t.Fatalf("re-issue: %s", asJSON(t, again))
	}
	if n := b.tickets("lost"); n != 1 {
		t.Fatalf("%d tickets, want 1", n)
	}
}

func TestArgsTheSchemaRefusesAreRejected(t *testing.T) {
	t.Parallel()
	b := setup(t, sandbox.Faults{})
	cs := connect(t, b.addr)
	res := mustCall(t, cs, "send_payment", map[string]any{"invoice_id": "inv_bad", "amount_cents": -5, "currency": "EUR"}, named("conv-bad", 1))
	if !res.IsError || status(res) != "rejected" || !strings.Contains(text(t, res), "amount_cents") {
		t.Fatalf("isError %v, _meta %v, %s", res.IsError, res.Meta, text(t, res))
	}
	if n := b.payments("inv_bad"); n != 0 {
		t.Fatalf("%d payments", n)
	}
}

func TestAnUnknownToolIsAnError(t *testing.T) {
	t.Parallel()
	b := setup(t, sandbox.Faults{})
	_, err := call(context.Background(), connect(t, b.addr), "delete_everything", map[string]any{}, named("c", 1))
	if err == nil || !strings.Contains(err.Error(), "delete_everything") {
		t.Fatalf("got %v", err)
	}
}

func TestACallWithNoResultInTimeSaysToReissueAndTheReissueGetsIt(t *testing.T) {
	t.Parallel()
	b := setup(t, sandbox.Faults{LatencyMS: 1500})
	_, hasty := serve(t, b.st, nil, func(c *mcpfront.Config) { c.Wait = 200 * time.Millisecond })
	_, err := call(context.Background(), connect(t, hasty), "send_payment", payment("inv_slow"), named("conv-slow", 1))
	var rpc *jsonrpc.Error
	if !errors.As(err, &rpc) || rpc.Code != mcpfront.CodeNoResultYet || !strings.Contains(rpc.Message, "send the same tools/call again") {
		t.Fatalf("want a no-result-yet error, got %v", err)
	}
	res := mustCall(t, connect(t, b.addr), "send_payment", payment("inv_slow"), named("conv-slow", 1))
	if res.IsError {
		t.Fatalf("re-issue: %s", asJSON(t, res))
	}
	if n := b.payments("inv_slow"); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
}

// TestCloseEndsTheCallsStillWaiting: a call waiting for its result when
// the front door closes is told to send it again, and nothing the front
// door started keeps running. Not parallel: it counts goroutines.
func TestCloseEndsTheCallsStillWaiting(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) }) // runs last, after the stack stopped
	b := setup(t, sandbox.Faults{LatencyMS: 3000})
	cs := connect(t, b.addr)
	answered := make(chan error, 1)
	go func() {
		_, err := call(context.Background(), cs, "send_payment", payment("inv_closed"), named("conv-closed", 1))
		answered <- err
	}()
	testenv.Eventually(t, 30*time.Second, "the call's job", func() bool {
		s, err := b.st.JS.Stream(context.Background(), jobs.JobsStream)
		if err != nil {
			return false
		}
		info, err := s.Info(context.Background())
		return err == nil && info.State.Msgs > 0
	})
	b.front.Close()
	b.front.Close() // idempotent
	err := <-answered
	var rpc *jsonrpc.Error
	if !errors.As(err, &rpc) || rpc.Code != mcpfront.CodeNoResultYet || !strings.Contains(rpc.Message, "shutting down") {
		t.Fatalf("want a no-result-yet error, got %v", err)
	}
	// Closed, it answers every call so.
	_, err = call(context.Background(), cs, "send_payment", payment("inv_closed"), named("conv-closed", 1))
	if !errors.As(err, &rpc) || rpc.Code != mcpfront.CodeNoResultYet {
		t.Fatalf("after Close: %v", err)
	}
}
