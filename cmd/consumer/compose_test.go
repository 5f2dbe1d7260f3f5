package main

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/toolq/toolq/internal/cli"
)

// TestComposeFileIsValid checks docker-compose.yml without a Docker engine:
// it parses, its services are the ones the README names, and the consumer's
// command line is one this consumer accepts.
func TestComposeFileIsValid(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Build       string            `yaml:"build"`
			Entrypoint  []string          `yaml:"entrypoint"`
			Command     []string          `yaml:"command"`
			Environment map[string]string `yaml:"environment"`
			DependsOn   map[string]any    `yaml:"depends_on"`
			Volumes     []string          `yaml:"volumes"`
			Restart     string            `yaml:"restart"`
			Healthcheck struct {
				Test []string `yaml:"test"`
			} `yaml:"healthcheck"`
		} `yaml:"services"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&compose); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"nats", "postgres", "jaeger", "sandbox", "consumer", "prometheus", "grafana"} {
		s, ok := compose.Services[name]
		if !ok || (s.Image == "" && s.Build == "") {
			t.Fatalf("service %s missing or without image/build", name)
		}
		for _, v := range s.Volumes { // files of this repository mounted in
			if src, _, _ := strings.Cut(v, ":"); strings.HasPrefix(src, "./") {
				if _, err := os.Stat("../../" + src); err != nil {
					t.Fatalf("%s mounts %s: %v", name, src, err)
				}
			}
		}
		// Pinned, restarted, and probed where the image can run a probe.
		if _, tag, ok := strings.Cut(s.Image, ":"); s.Image != "" && (!ok || tag == "latest" || !strings.ContainsAny(tag, "0123456789")) {
			t.Errorf("%s: image %q is not pinned to a version", name, s.Image)
		}
		if s.Restart != "unless-stopped" {
			t.Errorf("%s: restart %q, want unless-stopped", name, s.Restart)
		}
		if name != "jaeger" && len(s.Healthcheck.Test) == 0 {
			t.Errorf("%s: no healthcheck", name)
		}
		if h := s.Healthcheck.Test; len(h) > 2 && h[1] == "/usr/local/bin/consumer" {
			// the image's own binary: the command must exist
			var out strings.Builder
			if err := run(context.Background(), append(append([]string{}, h[2:3]...), "--help"), cli.IO{Out: &out, Err: &out}, func(string) string { return "" }); err != nil {
				t.Errorf("%s: healthcheck %v: %v", name, h, err)
			}
		}
		for dep := range s.DependsOn {
			if _, ok := compose.Services[dep]; !ok {
				t.Fatalf("%s depends on unknown service %s", name, dep)
			}
		}
	}
	// Prometheus scrapes the consumer where it serves /metrics.
	prom, err := os.ReadFile("../../deploy/prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	// …and loads the alerts from where its rule_files says (beside its configuration).
	if p := compose.Services["prometheus"]; !slices.Contains(p.Volumes, "./docs/alerts.yaml:/etc/prometheus/alerts.yaml:ro") {
		t.Errorf("prometheus does not mount docs/alerts.yaml beside its configuration: %v", p.Volumes)
	}
	c := compose.Services["consumer"]
	if addr := c.Command[slices.Index(c.Command, "--health-addr")+1]; !strings.Contains(string(prom), `"consumer:`+addr[strings.LastIndex(addr, ":")+1:]+`"`) {
		t.Fatalf("prometheus.yml does not scrape the consumer's --health-addr %s", addr)
	}
	for _, k := range []string{"NATS_URL", "DATABASE_URL", "TOOLQ_SANDBOX_URL"} {
		if c.Environment[k] == "" {
			t.Fatalf("consumer without %s", k)
		}
	}
	// Every flag of the command must exist: --help after them stops before running.
	var out strings.Builder
	args := append(append([]string{}, c.Command...), "--help")
	if err := run(context.Background(), args, cli.IO{Out: &out, Err: &out}, func(string) string { return "" }); err != nil {
		t.Fatalf("consumer %v: %v", c.Command, err)
	}
}
