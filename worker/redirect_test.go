package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/tools"
	"github.com/toolq/toolq/worker"
)

// TestWriteAnsweredWithARedirectAfterItsEffectIsNotSentAgain: a 302 to a
// POST is what Post/Redirect/Get answers after the write was made (Rails'
// redirect_to, Express's res.redirect, Django's HttpResponseRedirect). An
// unkeyed write so answered is not sent again: its outcome is unknown, so
// it becomes indeterminate, and the downstream made one ticket.
func TestWriteAnsweredWithARedirectAfterItsEffectIsNotSentAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var created atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodPost: // create, then redirect to what was created (PRG)
			n := created.Add(1)
			http.Redirect(w, r, fmt.Sprintf("/tickets/%d", n), http.StatusFound)
		default:
			fmt.Fprintf(w, `{"path":%q}`, r.URL.Path)
		}
	}))
	defer srv.Close()
	exec, err := tools.HTTPExecutor(tools.HTTP{Method: "POST", URL: srv.URL + "/tickets"})
	if err != nil {
		t.Fatal(err)
	}
	fwd := exec.ForwardsKey()
	reg, err := tools.NewRegistry([]tools.Definition{{Name: "ticket", Class: tools.UnkeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
		Executor: exec, Downstream: exec.Downstream(), ForwardsKey: &fwd, Timeout: 5 * time.Second,
		Breaker: tools.Breaker{Failures: 1000}}}, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := startWorker(t, reg, worker.Config{RetryDelay: 20 * time.Millisecond, Consumer: worker.Consumer{MaxDeliver: 3}})
	client := jobs.NewClient(js)
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	res, err := client.PublishAndAwait(actx, &jobs.Job{ConversationID: "c", Tool: "ticket", ToolUseID: "toolu_1", Args: json.RawMessage(`{"title":"broken"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != jobs.StatusIndeterminate || res.Error == nil || res.Error.Code != "http_302" {
		t.Fatalf("result %s %+v, want indeterminate http_302", res.Status, res.Error)
	}
	if n := created.Load(); n != 1 {
		t.Fatalf("one unkeyed_write call, answered 302 after it created its ticket, created %d tickets", n)
	}
}
