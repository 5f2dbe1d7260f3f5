package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
)

// TestApproveFindsTheTenantsWithTheConsumersPermissions: `consumer
// approve` without --tenants, connected as the consumer's user of
// deploy/nats-tenants.conf (as docs/tenants.md runs it), finds the tenants
// whose results streams NATS has: acme and globex.
func TestApproveFindsTheTenantsWithTheConsumersPermissions(t *testing.T) {
	for env, pw := range map[string]string{"TOOLQ_NATS_PASSWORD_CONSUMER": "pconsumer1", "TOOLQ_NATS_PASSWORD_ACME": "pacme1", "TOOLQ_NATS_PASSWORD_GLOBEX": "pglobex1",
		"TOOLQ_NATS_PASSWORD_ACME_APPROVER_FINANCE": "pacmefin1", "TOOLQ_NATS_PASSWORD_GLOBEX_APPROVER_FINANCE": "pglobexfin1"} {
		t.Setenv(env, pw)
	}
	file, err := server.ProcessConfigFile("../../deploy/nats-tenants.conf")
	if err != nil {
		t.Fatal(err)
	}
	n := testenv.StartNATS(t, func(o *server.Options) {
		store, maxMem, maxStore := o.StoreDir, o.JetStreamMaxMemory, o.JetStreamMaxStore
		*o = *file
		o.Host, o.Port, o.HTTPPort, o.NoLog, o.NoSigs = "127.0.0.1", server.RANDOM_PORT, 0, true, true
		o.StoreDir, o.JetStreamMaxMemory, o.JetStreamMaxStore = store, maxMem, maxStore
	})
	nc := n.Connect(nats.UserInfo("toolq", "pconsumer1"))
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := jobs.ProvisionStreams(ctx, js, jobs.Streams{Tenants: []string{"acme", "globex"}}); err != nil {
		t.Fatal(err)
	}
	if got, err := tenantsOf(ctx, js); fmt.Sprint(got) != "[acme globex]" || err != nil {
		t.Fatalf("tenants found: %v %v, want [acme globex]", got, err)
	}

	// A user that may not list the streams gets an error, never "no
	// tenants": without them, a tenant's call would be announced as the
	// default tenant's.
	acme, _ := jetstream.New(n.Connect(nats.UserInfo("acme", "pacme1"), nats.CustomInboxPrefix("_INBOX_acme")))
	if got, err := tenantsOf(ctx, acme); err == nil || !strings.Contains(err.Error(), "--tenants") {
		t.Fatalf("tenants found without the permission to list streams: %v %v", got, err)
	}
}
