package operate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/jobs"
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
