package soak

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// buildBinaries builds nats-server (from the module in go.mod), consumer and
// sandbox into dir.
func buildBinaries(t *testing.T, dir string) {
	t.Helper()
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	for _, args := range [][]string{
		{"build", "-o", filepath.Join(dir, "nats-server"), "github.com/nats-io/nats-server/v2"},
		{"build", "-o", dir + "/", "./cmd/consumer", "./cmd/sandbox"},
	} {
		cmd := exec.Command(goBin, args...)
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("soak: go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// lineWatch is a process's stdout: it appends to the log and reports the
// first line matching a pattern.
type lineWatch struct {
	log     io.Writer
	pattern *regexp.Regexp
	found   chan string
	mu      sync.Mutex
	buf     []byte
	sent    bool
}

func (w *lineWatch) Write(p []byte) (int, error) {
	w.log.Write(p)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		line := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		if m := w.pattern.FindStringSubmatch(line); m != nil && !w.sent {
			w.sent = true
			w.found <- m[len(m)-1]
		}
	}
	return len(p), nil
}

// proc is one run of a binary.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error
}

// startProc starts bin with args, its output appended to logPath, and
// waits until a line of its standard output or error matches ready (the
// last group is returned), or it exits, or 30s pass.
func startProc(bin string, args, env []string, logPath string, ready *regexp.Regexp) (*proc, string, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, "", err
	}
	fmt.Fprintf(logf, "\n=== %s %s %s\n", time.Now().Format(time.RFC3339Nano), filepath.Base(bin), strings.Join(args, " "))
	w := &lineWatch{log: logf, pattern: ready, found: make(chan string, 1)}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, "", err
	}
	p := &proc{cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		fmt.Fprintf(logf, "=== %s exited: %v\n", time.Now().Format(time.RFC3339Nano), p.err)
		logf.Close()
		close(p.exited)
	}()
	select {
	case m := <-w.found:
		return p, m, nil
	case <-p.exited:
		return nil, "", fmt.Errorf("%s exited before it was ready: %v (log %s)", filepath.Base(bin), p.err, logPath)
	case <-time.After(30 * time.Second):
		p.kill()
		return nil, "", fmt.Errorf("%s not ready in 30s (log %s)", filepath.Base(bin), logPath)
	}
}

func (p *proc) signal(s syscall.Signal) { p.cmd.Process.Signal(s) }

func (p *proc) kill() {
	p.cmd.Process.Signal(syscall.SIGCONT)
	p.cmd.Process.Kill()
	<-p.exited
}

// stop sends SIGTERM and waits, then SIGKILL after timeout.
func (p *proc) stop(timeout time.Duration) {
	p.cmd.Process.Signal(syscall.SIGCONT)
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(timeout):
		p.kill()
	}
}

func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// natsProc is the nats-server process, restartable on the same port and
// store.
type natsProc struct {
	bin, dir, log string
	port, mport   int
	p             *proc
}

func (n *natsProc) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

func (n *natsProc) start() error {
	p, _, err := startProc(n.bin, []string{"-a", "127.0.0.1", "-p", strconv.Itoa(n.port), "-m", strconv.Itoa(n.mport),
		"-js", "-sd", n.dir}, nil, n.log, regexp.MustCompile(`Server is ready`))
	if err != nil {
		return err
	}
	n.p = p
	// Ready for clients is not yet ready for JetStream: ask its health.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz?js-enabled-only=true", n.mport))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("nats-server: JetStream not healthy in 30s")
}

// restart stops the server with SIGTERM, waits down, and starts it again.
func (n *natsProc) restart(down time.Duration) error {
	n.p.stop(15 * time.Second)
	time.Sleep(down)
	var err error
	for range 5 {
		if err = n.start(); err == nil {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return err
}

// consumerProc is one consumer slot: its current process, restarted after
// a kill or an unexpected exit.
type consumerProc struct {
	idx       int
	bin, log  string
	args, env []string

	mu          sync.Mutex
	p           *proc
	health      string
	incarnation int
	busy        bool // a fault holds it (killed or stopped)
	exits       int  // exits nobody asked for
	outcomes    map[int]map[string]float64
}

func (c *consumerProc) start() error {
	p, health, err := startProc(c.bin, c.args, c.env, c.log, regexp.MustCompile(`health\s+http://(\S+)/healthz`))
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.p, c.health = p, health
	c.incarnation++
	c.mu.Unlock()
	return nil
}

// startRetrying starts the consumer, trying again while it cannot (NATS
// or Postgres may be down at that moment), until the deadline.
func (c *consumerProc) startRetrying(deadline time.Time) error {
	for {
		err := c.start()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// scrape reads the consumer's toolq_jobs_total by outcome into its
// incarnation's figures.
func (c *consumerProc) scrape() {
	c.mu.Lock()
	health, inc, p, busy := c.health, c.incarnation, c.p, c.busy
	c.mu.Unlock()
	if p == nil || busy || !p.alive() {
		return
	}
	cl := http.Client{Timeout: 500 * time.Millisecond}
	resp, err := cl.Get("http://" + health + "/metrics")
	if err != nil {
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	got := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "toolq_jobs_total{") {
			continue
		}
		m := outcomeLabel.FindStringSubmatch(line)
		fields := strings.Fields(line)
		if m == nil || len(fields) < 2 {
			continue
		}
		v, _ := strconv.ParseFloat(fields[len(fields)-1], 64)
		got[m[1]] += v
	}
	c.mu.Lock()
	if c.outcomes == nil {
		c.outcomes = map[int]map[string]float64{}
	}
	c.outcomes[inc] = got
	c.mu.Unlock()
}

var outcomeLabel = regexp.MustCompile(`toolq_outcome="([a-z_]+)"`)

// sandboxFaults sets the sandbox's fault knobs through its API.
func sandboxFaults(base string, body string) error {
	resp, err := http.Post(base+"/v1/_faults", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("sandbox faults %s: %s", body, resp.Status)
	}
	return nil
}

// ctxSleep sleeps for d or until ctx ends.
func ctxSleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
