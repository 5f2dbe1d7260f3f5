package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
)

// TestDashboardQueriesExportedMetrics: docs/dashboards/toolq.json parses as
// a Grafana dashboard, and every metric its panels query is one a running
// consumer serves at /metrics, by the name Prometheus gives it, after one
// job (histograms have no series before their first observation).
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../docs/dashboards/toolq.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("toolq.json: %v", err)
	}
	queried := map[string]string{} // metric → panel
	labels := map[string]string{}  // label grouped by → panel
	name := regexp.MustCompile(`\b(toolq_[a-z_]+|go_[a-z_]+|process_[a-z_]+)\b`)
	grouping := regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	matchers := regexp.MustCompile(`\{[^}]*\}`)
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 && !strings.HasPrefix(p.Title, "#") {
			continue // a row
		}
		for _, target := range p.Targets {
			if target.Expr == "" {
				t.Errorf("panel %q has a target without expr", p.Title)
			}
			for _, g := range grouping.FindAllStringSubmatch(target.Expr, -1) {
				for _, l := range strings.Split(g[1], ",") {
					if l = strings.TrimSpace(l); l != "le" {
						labels[l] = p.Title
					}
				}
			}
			bare := matchers.ReplaceAllString(grouping.ReplaceAllString(target.Expr, ""), "")
			for _, m := range name.FindAllString(bare, -1) {
				queried[m] = p.Title
			}
		}
	}
	if dash.Title == "" || dash.UID == "" || len(queried) == 0 {
		t.Fatalf("dashboard %q (uid %q) queries nothing", dash.Title, dash.UID)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var out, logs testenv.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--data-dir", t.TempDir(), "--nats-listen", "127.0.0.1:0", "--sandbox-listen", "127.0.0.1:0",
			"--health-addr", "127.0.0.1:0"}, cli.IO{Out: &out, Err: &logs}, func(string) string { return "" })
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	}()
	var natsURL, healthURL string
	testenv.Eventually(t, 60*time.Second, "the banner", func() bool {
		natsURL, healthURL = find(out.String(), `embedded, (nats://\S+)`), find(out.String(), `health\s+(http://[^/\s]+)`)
		return natsURL != "" && healthURL != ""
	})
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	j := &jobs.Job{ConversationID: "dash", TurnIndex: 1, Tool: "send_payment", ToolUseID: "toolu_dash",
		Args: json.RawMessage(`{"invoice_id":"inv_dash","amount_cents":100,"currency":"EUR"}`)}
	if r, err := jobs.NewClient(js).PublishAndAwait(wctx, j); err != nil || r.Status != jobs.StatusOK {
		t.Fatalf("%+v %v\n%s", r, err, logs.String())
	}
	var body string
	testenv.Eventually(t, 10*time.Second, "the job counted at /metrics", func() bool {
		resp, err := http.Get(healthURL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		return strings.Contains(body, "toolq_jobs_total{")
	})
	served := map[string]bool{}
	for _, line := range strings.Split(body, "\n") {
		if f := strings.FieldsFunc(line, func(r rune) bool { return r == '{' || r == ' ' }); len(f) > 0 && !strings.HasPrefix(line, "#") {
			served[f[0]] = true
		}
	}
	for m, panel := range queried {
		if !served[m] {
			t.Errorf("panel %q queries %s, which /metrics does not serve", panel, m)
		}
	}
	for l, panel := range labels {
		if !strings.Contains(body, l+`="`) {
			t.Errorf("panel %q groups by %s, a label no metric at /metrics has", panel, l)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}
