package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/jobs"
)

// The scenarios that run the consumer binary itself, as separate processes
// on one durable consumer: the scaling runs (1, 2, 4 processes) and the
// memory run (one process at a fixed rate for minutes, its RSS sampled).

// Processes is one scaling run's figures: n consumer processes on one
// durable, the median of Reps runs.
type Processes struct {
	N int `json:"processes"`
	Throughput
}

// Memory is the consumer process's resident memory over a long run at a
// fixed rate.
type Memory struct {
	Rate    int       `json:"rate"`
	Seconds float64   `json:"seconds"`
	Jobs    int       `json:"jobs"`
	Samples []float64 `json:"rss_mib_samples"` // one every Seconds/60 (at least 1s)
	// StartMiB is the median of the samples in the run's second tenth
	// (after warm-up), EndMiB the median of its last tenth; GrowthPct is
	// (End - Start) / Start.
	StartMiB  float64 `json:"start_rss_mib"`
	EndMiB    float64 `json:"end_rss_mib"`
	MaxMiB    float64 `json:"max_rss_mib"`
	GrowthPct float64 `json:"growth_pct"`
}

// consumerProc is one running consumer process.
type consumerProc struct {
	cmd     *exec.Cmd
	health  string // its /readyz address
	stderr  *strings.Builder
	gone    chan struct{} // closed when it has exited
	waitErr error         // how it exited, once gone is closed
}

// writeTools writes the registry the consumer processes load: the sandbox
// payments API over HTTP as a keyed write that forwards its key, as "pay"
// (the fresh, duplicate and latency runs), "pay_b" (the same, for the
// second build of a comparison), "scale" (the scaling and memory runs) and
// "slow" (every payment takes SlowLatency in the sandbox), each with
// Concurrency calls at once, the naive dispatcher's.
func (b *bench) writeTools(dir string) (string, error) {
	path := filepath.Join(dir, "bench-tools.yaml")
	var spec strings.Builder
	spec.WriteString("tools:\n")
	for _, name := range []string{"pay", "pay_b", "scale", "slow", "idle"} { // idle: no job is published to it (measureStartups)
		fmt.Fprintf(&spec, `  - name: %s
    class: keyed_write
    concurrency: %d
    schema: {type: object}
    http:
      method: POST
      url: %s/v1/payments
`, name, b.cfg.Concurrency, b.url)
		if name == "slow" {
			fmt.Fprintf(&spec, "      headers: {Sandbox-Latency-Ms: \"%d\"}\n", b.cfg.SlowLatency.Milliseconds())
		}
	}
	return path, os.WriteFile(path, []byte(spec.String()), 0o600)
}

// startProcs starts n processes of the consumer binary bin on one durable
// taking one tool's jobs, with the settings the naive dispatcher has (4 ×
// Concurrency jobs in flight, each process), and returns once every one is
// ready (its /readyz answers).
func (b *bench) startProcs(ctx context.Context, bin, durable, tool string, n int) ([]*consumerProc, error) {
	var procs []*consumerProc
	for i := range n {
		port, err := testenv.FreePort()
		if err != nil {
			return procs, err
		}
		p := &consumerProc{health: fmt.Sprintf("127.0.0.1:%d", port), stderr: &strings.Builder{}}
		p.cmd = exec.CommandContext(ctx, bin, b.consumerArgs(p, durable, tool, i, n)...)
		if err := p.start(); err != nil {
			return procs, err
		}
		procs = append(procs, p)
	}
	for _, p := range procs {
		if err := waitReady(ctx, p); err != nil {
			return procs, err
		}
	}
	return procs, nil
}

// consumerArgs is the arguments of the consumer process p, the i-th of n
// on durable taking tool's jobs.
func (b *bench) consumerArgs(p *consumerProc, durable, tool string, i, n int) []string {
	args := []string{"run", "--nats-url", b.cfg.NATSURL, "--database-url", b.cfg.DatabaseURL,
		"--tools", b.toolsFile, "--durable", durable, "--filter-subject", jobs.JobSubject(tool),
		"--workers", strconv.Itoa(4 * b.cfg.Concurrency), "--max-ack-pending", strconv.Itoa(4 * b.cfg.Concurrency * n),
		"--health-addr", p.health, "--debug-pprof", "--log-level", "warn"}
	if b.cfg.ProfileDir != "" && !isLatencyRun(b.profileName) { // a latency run's are of its counted jobs (captureCounted)
		name := filepath.Join(b.cfg.ProfileDir, b.profileName)
		if n > 1 {
			name += fmt.Sprintf("-%d", i+1)
		}
		args = append(args, "--debug-cpuprofile", name+".prof")
	}
	return args
}

// start starts the process and watches for its exit.
func (p *consumerProc) start() error {
	p.cmd.Stderr = limitedWriter{p.stderr, 64 << 10}
	p.cmd.Cancel = func() error { return p.cmd.Process.Signal(syscall.SIGTERM) }
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.cmd.Path, err)
	}
	p.gone = make(chan struct{})
	go func() { p.waitErr = p.cmd.Wait(); close(p.gone) }()
	return nil
}

// startNaiveProc starts the naive dispatcher as a process of its own
// (Config.NaiveCmd) and returns once it is pulling.
func (b *bench) startNaiveProc(ctx context.Context, cfg NaiveConfig) (*consumerProc, error) {
	port, err := testenv.FreePort()
	if err != nil {
		return nil, err
	}
	p := &consumerProc{health: fmt.Sprintf("127.0.0.1:%d", port), stderr: &strings.Builder{}}
	args := append(slices.Clone(b.cfg.NaiveCmd[1:]), "--nats-url", cfg.NATSURL, "--tool-url", cfg.ToolURL, "--tool", cfg.Tool,
		"--durable", cfg.Durable, "--workers", strconv.Itoa(cfg.Workers), "--concurrency", strconv.Itoa(cfg.Concurrency),
		"--debug-addr", p.health)
	if cfg.LedgerURL != "" {
		args = append(args, "--ledger-url", cfg.LedgerURL)
	}
	p.cmd = exec.CommandContext(ctx, b.cfg.NaiveCmd[0], args...)
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.start(); err != nil {
		return nil, err
	}
	ready := make(chan bool, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		ready <- err == nil && strings.TrimSpace(line) == "ready"
		io.Copy(io.Discard, out)
	}()
	select {
	case ok := <-ready:
		if ok {
			return p, nil
		}
	case <-time.After(30 * time.Second):
	case <-ctx.Done():
	}
	stopProcs([]*consumerProc{p})
	return nil, fmt.Errorf("the naive dispatcher process was not ready:\n%s", p.stderr)
}

// mallocs is how many heap objects the processes have allocated, and how
// many bytes, since they started (runtime.MemStats, from their
// /debug/vars); ok is false if a process did not answer.
func (b *bench) mallocs(ctx context.Context, procs []*consumerProc) (objects, bytes float64, ok bool) {
	client := http.Client{Timeout: 5 * time.Second}
	for _, p := range procs {
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+p.health+"/debug/vars", nil)
		resp, err := client.Do(req)
		if err != nil {
			b.cfg.Logger.Warn("bench: allocations", "error", err)
			return 0, 0, false
		}
		var vars struct {
			MemStats *struct{ Mallocs, TotalAlloc float64 } `json:"memstats"`
		}
		err = json.NewDecoder(resp.Body).Decode(&vars)
		resp.Body.Close()
		if err == nil && vars.MemStats == nil {
			err = errors.New("no memstats in /debug/vars")
		}
		if err != nil {
			b.cfg.Logger.Warn("bench: allocations", "error", err)
			return 0, 0, false
		}
		objects, bytes = objects+vars.MemStats.Mallocs, bytes+vars.MemStats.TotalAlloc
	}
	return objects, bytes, true
}

// stopProcs drains and stops the processes, and returns their CPU seconds
// (the kernel's accounting of each exited process) and the largest peak
// RSS among them (VmHWM, read before the stop: the exited process's
// ru_maxrss would count the bench's own memory, which the child shared
// between its fork and its exec).
func stopProcs(procs []*consumerProc) (cpu, peakMiB float64, err error) {
	for _, p := range procs {
		if hwm, err := procMiB(p.cmd.Process.Pid, "VmHWM:"); err == nil {
			peakMiB = max(peakMiB, hwm)
		}
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		<-p.gone
		werr, st := p.waitErr, p.cmd.ProcessState
		if st == nil {
			err = errors.Join(err, werr)
			continue
		}
		cpu += (st.UserTime() + st.SystemTime()).Seconds()
		if werr != nil {
			err = errors.Join(err, fmt.Errorf("consumer process: %v\n%s", werr, p.stderr))
		}
	}
	return cpu, peakMiB, err
}

// exited is closed when any of the processes exits.
func exited(procs []*consumerProc) <-chan struct{} {
	c := make(chan struct{})
	var once sync.Once
	for _, p := range procs {
		go func() {
			<-p.gone
			once.Do(func() { close(c) })
		}()
	}
	return c
}

func waitReady(ctx context.Context, p *consumerProc) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.gone:
			return fmt.Errorf("consumer process exited before it was ready (%v):\n%s", p.waitErr, p.stderr)
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+p.health+"/readyz", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("consumer process not ready within 30s:\n%s", p.stderr)
}

// processesRun is the scaling scenario for n processes: a backlog of fresh
// "scale" jobs, n consumer processes started and ready, and the rate at
// which results arrive once all n are ready (the jobs answered while the
// later processes were still starting do not count).
func (b *bench) processesRun(n int) func(context.Context, int) (time.Duration, int, error) {
	return func(ctx context.Context, rep int) (time.Duration, int, error) {
		batch := b.jobsFor("scale", 100*n+rep, b.cfg.Jobs, false)
		if err := b.publishAll(ctx, batch); err != nil {
			return 0, 0, err
		}
		return b.timed(ctx, batch, b.toolqStarter(build{bin: b.cfg.ConsumerBin}, "scale", n, nil))
	}
}

// memory runs one consumer process at rate for d, sampling its RSS.
func (b *bench) memory(ctx context.Context, rate int, d time.Duration) (Memory, error) {
	procs, err := b.startProcs(ctx, b.cfg.ConsumerBin, "bench-toolq-scale", "scale", 1)
	if err != nil {
		stopProcs(procs)
		return Memory{}, err
	}
	pid := procs[0].cmd.Process.Pid
	n := max(int(float64(rate)*d.Seconds()), 1)
	batch := b.jobsFor("scale", 9000, n, false)
	want := make(map[string]bool, n)
	for _, j := range batch {
		want[j.ToolUseID] = true
	}
	done := b.results.expect(want)
	every := max(d/60, time.Second)
	m := Memory{Rate: rate, Seconds: d.Seconds(), Jobs: n}
	sampled := make(chan struct{})
	stopSampling := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-t.C:
				if rss, err := procMiB(pid, "VmRSS:"); err == nil {
					m.Samples = append(m.Samples, rss)
				}
			}
		}
	}()
	client := jobs.NewClient(b.js)
	pace := paced(rate)
	for i, j := range batch {
		pace(i)
		go client.Publish(ctx, j)
	}
	close(stopSampling)
	<-sampled
	var werr error
	select {
	case <-done:
	case <-exited(procs):
		werr = errors.New("the consumer process stopped on its own")
	case <-time.After(2 * time.Minute):
		werr = fmt.Errorf("%d results missing", b.results.missing())
	}
	if _, _, err := stopProcs(procs); err != nil || werr != nil {
		return Memory{}, errors.Join(werr, err)
	}
	m.summarize()
	return m, nil
}

// summarize sets Start, End, Max and Growth from the samples.
func (m *Memory) summarize() {
	k := len(m.Samples)
	if k == 0 {
		return
	}
	median := func(s []float64) float64 {
		s = slices.Clone(s)
		slices.Sort(s)
		return s[len(s)/2]
	}
	tenth := max(k/10, 1)
	m.StartMiB = median(m.Samples[min(tenth, k-1):min(2*tenth, k)])
	m.EndMiB = median(m.Samples[k-tenth:])
	m.MaxMiB = slices.Max(m.Samples)
	if m.StartMiB > 0 {
		m.GrowthPct = 100 * (m.EndMiB - m.StartMiB) / m.StartMiB
	}
}

// procMiB is one of a process's memory figures in /proc/PID/status:
// "VmRSS:" its resident set now, "VmHWM:" the largest it has been.
func procMiB(pid int, field string) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// limitedWriter keeps the first max bytes written to it.
type limitedWriter struct {
	b   *strings.Builder
	max int
}

func (w limitedWriter) Write(p []byte) (int, error) {
	if room := w.max - w.b.Len(); room > 0 {
		w.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// saveAllocs writes each process's allocation profile (since its start)
// to the profile directory, as name[-N].allocs.
func (b *bench) saveAllocs(ctx context.Context, procs []*consumerProc, name string) {
	for i, p := range procs {
		file := filepath.Join(b.cfg.ProfileDir, name)
		if len(procs) > 1 {
			file += fmt.Sprintf("-%d", i+1)
		}
		if err := fetchTo(ctx, http.DefaultClient, "http://"+p.health+"/debug/pprof/allocs", file+".allocs"); err != nil {
			b.cfg.Logger.Warn("bench: allocation profile", "error", err)
		}
	}
}
