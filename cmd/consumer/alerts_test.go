package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/worker"
)

// TestAlertRules: every rule of docs/alerts.yaml names only metrics (and
// labels, and outcomes) that a running consumer exports on /metrics, and
// links to a section of docs/operations.md that exists.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	var file struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert       string
				Expr        string
				For         string
				Labels      map[string]string
				Annotations map[string]string
			}
		}
	}
	data, err := os.ReadFile("../../docs/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		t.Fatalf("docs/alerts.yaml: %v", err)
	}
	runbook, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(string(runbook), -1) {
		anchors[anchor(m[1])] = true
	}

	exported := scrapeConsumer(t)
	outcomes := map[string]bool{}
	for _, o := range []worker.Outcome{worker.OutcomeOK, worker.OutcomeError, worker.OutcomeRejected, worker.OutcomeIndeterminate,
		worker.OutcomeDuplicate, worker.OutcomeRetry, worker.OutcomeFenced, worker.OutcomeDeadLetter} {
		outcomes[string(o)] = true
	}
	metricRef := regexp.MustCompile(`\btoolq_[a-z_]+\b`)
	outcomeRef := regexp.MustCompile(`toolq_outcome\s*(=~|=)\s*"([^"]*)"`)
	seen := map[string]bool{}
	n := 0
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			n++
			switch {
			case r.Alert == "" || strings.TrimSpace(r.Expr) == "":
				t.Errorf("a rule without alert or expr: %+v", r)
				continue
			case seen[r.Alert]:
				t.Errorf("%s: defined twice", r.Alert)
			case r.Labels["severity"] == "" || r.Annotations["summary"] == "":
				t.Errorf("%s: wants labels.severity and annotations.summary", r.Alert)
			}
			seen[r.Alert] = true
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
				}
			}
			link, ok := strings.CutPrefix(r.Annotations["runbook"], "docs/operations.md#")
			if !ok || !anchors[link] {
				t.Errorf("%s: runbook %q is not a section of docs/operations.md", r.Alert, r.Annotations["runbook"])
			}
			refs := metricRef.FindAllString(r.Expr, -1)
			var metrics int
			for _, ref := range refs {
				if ref == "toolq_outcome" || ref == "toolq_tool" || ref == "toolq_downstream" || ref == "toolq_tool_class" ||
					ref == "toolq_dlq_reason" || ref == "toolq_dependency" || ref == "toolq_duplicate_route" {
					if !exported.labels[ref] {
						t.Errorf("%s: label %s is on no exported metric", r.Alert, ref)
					}
					continue
				}
				metrics++
				if !exported.samples[ref] {
					t.Errorf("%s: %s is not a metric the consumer exports", r.Alert, ref)
				}
			}
			if metrics == 0 && !strings.Contains(r.Expr, `up{job="toolq-consumer"}`) {
				t.Errorf("%s: names no toolq metric, nor the consumers' scrape job", r.Alert)
			}
			for _, m := range outcomeRef.FindAllStringSubmatch(r.Expr, -1) {
				for _, v := range strings.Split(m[2], "|") {
					if !outcomes[v] {
						t.Errorf("%s: toolq_outcome %q is not an outcome the worker counts", r.Alert, v)
					}
				}
			}
		}
	}
	prom, err := os.ReadFile("../../deploy/prometheus/prometheus.yml")
	if err != nil || !strings.Contains(string(prom), "job_name: toolq-consumer") || !strings.Contains(string(prom), `rule_files: ["alerts.yaml"]`) {
		t.Errorf("deploy/prometheus/prometheus.yml does not load alerts.yaml or scrape the job toolq-consumer (%v)", err)
	}
	// promtool checks what Prometheus would load: the rules, and the
	// configuration that loads them.
	if promtool, err := exec.LookPath("promtool"); err != nil {
		testenv.Missing(t, "promtool not found (Debian: apt-get install prometheus): the rules are not checked as Prometheus reads them")
	} else {
		for _, args := range [][]string{{"check", "rules", "../../docs/alerts.yaml"}, {"check", "config", "../../deploy/prometheus/prometheus.yml"},
			{"test", "rules", "../../deploy/prometheus/alerts_test.yml"}} {
			if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
				t.Errorf("promtool %v: %v\n%s", args, err, out)
			}
		}
	}
	for _, want := range []string{"ToolqNoConsumerUp", "ToolqDeadLettersGrowing", "ToolqDeadLettersRefused", "ToolqIndeterminateCalls", "ToolqBreakerOpen", "ToolqPendingGrowing",
		"ToolqLeasesExpiring", "ToolqLedgerUnreachable", "ToolqResultPublishesFailing"} {
		if !seen[want] {
			t.Errorf("no rule %s", want)
		}
	}
}

// anchor is the fragment GitHub gives a Markdown heading.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// exported is what a consumer's /metrics served: the sample names
// (histograms with their _bucket, _sum and _count) and the label names.
type exported struct {
	samples, labels map[string]bool
}

// scrapeConsumer runs a consumer with the demo tools, has it process one
// call and its duplicate, and scrapes its /metrics.
func scrapeConsumer(t *testing.T) exported {
	t.Helper()
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
		natsURL = find(out.String(), `embedded, (nats://\S+)`)
		healthURL = find(out.String(), `health\s+(http://[^/\s]+)`)
		return natsURL != "" && healthURL != ""
	})
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	client := jobs.NewClient(js)
	for _, id := range []string{"toolu_a", "toolu_b"} {
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := client.PublishAndAwait(wctx, &jobs.Job{ConversationID: "alerts", TurnIndex: 1, Tool: "send_payment", ToolUseID: id,
			Args: json.RawMessage(`{"invoice_id":"inv_1","amount_cents":100,"currency":"EUR"}`)})
		wcancel()
		if err != nil {
			t.Fatalf("%v\n%s", err, logs.String())
		}
	}
	resp, err := http.Get(healthURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	e := exported{samples: map[string]bool{}, labels: map[string]bool{}}
	sample := regexp.MustCompile(`(?m)^(toolq_[a-z_]+)(\{([^}]*)\})? `)
	label := regexp.MustCompile(`([a-z_]+)="`)
	for _, m := range sample.FindAllStringSubmatch(string(body), -1) {
		e.samples[m[1]] = true
		for _, l := range label.FindAllStringSubmatch(m[3], -1) {
			e.labels[l[1]] = true
		}
	}
	if len(e.samples) == 0 {
		t.Fatalf("no toolq metric on /metrics:\n%s", body)
	}
	return e
}
