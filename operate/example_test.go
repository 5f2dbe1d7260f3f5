package operate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/operate"
)

// An operator looks at what a replay of the payments would publish before
// publishing anything.
func ExampleReplay() {
	dir, _ := os.MkdirTemp("", "toolq-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	srv, _ := server.NewServer(&server.Options{Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	go srv.Start()
	srv.ReadyForConnections(10 * time.Second)
	defer srv.Shutdown()
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	jobs.ProvisionStreams(ctx, js, jobs.Streams{})
	client := jobs.NewClient(js)
	for i, tool := range []string{"send_payment", "create_ticket", "send_payment"} {
		client.Publish(ctx, &jobs.Job{ConversationID: "conv-1", TurnIndex: int64(i), Tool: tool,
			ToolUseID: fmt.Sprintf("toolu_%d", i), Args: json.RawMessage(`{}`)})
	}

	dry, err := operate.Replay(ctx, js, operate.ReplayRange{Subject: jobs.JobSubject("send_payment"), FromSeq: 1}, true)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range dry {
		fmt.Println(r.Seq, r.Subject, r.ToolUseID)
	}
	// Output:
	// 1 toolq.jobs.send_payment toolu_0
	// 3 toolq.jobs.send_payment toolu_2
}

// Given the ledger, a dry run says what each replayed job would do: a call
// the ledger completed is answered from it, one it has no row of runs.
func ExampleWithLedger() {
	dir, _ := os.MkdirTemp("", "toolq-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	srv, _ := server.NewServer(&server.Options{Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	go srv.Start()
	srv.ReadyForConnections(10 * time.Second)
	defer srv.Shutdown()
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	jobs.ProvisionStreams(ctx, js, jobs.Streams{})
	st, _ := ledger.OpenSQLite(ctx, filepath.Join(dir, "ledger.db"))
	defer st.Close()
	st.Migrate(ctx)
	client := jobs.NewClient(js)
	for i := range 2 {
		j := &jobs.Job{ConversationID: "conv-1", TurnIndex: int64(i), Tool: "send_payment",
			ToolUseID: fmt.Sprintf("toolu_%d", i), Args: json.RawMessage(`{}`)}
		client.Publish(ctx, j)
		if i == 0 { // the first call ran and completed
			key, _ := j.Key()
			m, _ := j.Call().Material()
			res, _ := st.Claim(ctx, []ledger.Claim{{Key: key, ConversationID: j.ConversationID, TurnIndex: j.TurnIndex, Tool: j.Tool,
				ArgsDigest: m.ArgsDigest(), ToolUseID: j.ToolUseID, Owner: "example", Lease: time.Minute}})
			st.Complete(ctx, res[0].Row.Fence(), json.RawMessage(`{"id":"pay_1"}`))
		}
	}

	dry, err := operate.Replay(ctx, js, operate.ReplayRange{Subject: jobs.JobsSubjects, FromSeq: 1}, true, operate.WithLedger(st))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range dry {
		fmt.Printf("%d %s: %s\n", r.Seq, r.Ledger, r.Outcome)
	}
	fmt.Println(operate.Summary(dry)[operate.Answered], "answered from the ledger")
	// Output:
	// 1 completed: answered from the ledger
	// 2 none: runs now
	// 1 answered from the ledger
}
