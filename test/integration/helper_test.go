package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/jobs"
	"github.com/toolq/toolq/worker"
)

const helperEnv = "TOOLQ_IT_HELPER"

// helperSpec configures a worker process started by a test.
type helperSpec struct {
	NATSURL    string `json:"nats_url"`
	DBURL      string `json:"db_url"`
	DataDir    string `json:"data_dir"`
	SandboxURL string `json:"sandbox_url"`
	KillAt     string `json:"kill_at"`   // a worker.FaultPoint: SIGKILL itself there
	KillTool   string `json:"kill_tool"` // only for jobs of this tool
	AckWaitMS  int    `json:"ack_wait_ms"`
	// Transactional adds record_refund to the registry (options.transactional).
	Transactional bool `json:"transactional"`
}

func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

// helperMain runs the worker process when the test binary is started as one:
// it stops at SIGTERM like the consumer does, or kills itself with SIGKILL at
// the fault point it was given.
func helperMain() bool {
	raw := os.Getenv(helperEnv)
	if raw == "" {
		return false
	}
	var spec helperSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	fail := func(err error) {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	hook := func(p worker.FaultPoint, j *jobs.Job) {
		if string(p) == spec.KillAt && j.Tool == spec.KillTool {
			fmt.Println("killed at", p)
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	var extra []string
	if spec.Transactional {
		extra = append(extra, refundToolYAML)
	}
	reg, err := testRegistry(spec.SandboxURL, logger, nil, extra...)
	if err != nil {
		fail(err)
	}
	st, err := embedded.Start(ctx, embedded.Config{NATSURL: spec.NATSURL, DatabaseURL: spec.DBURL, Dir: spec.DataDir, Tools: reg})
	if err != nil {
		fail(err)
	}
	w, err := st.NewWorker(ctx, worker.Config{
		Consumer: worker.Consumer{AckWait: time.Duration(spec.AckWaitMS) * time.Millisecond},
		Owner:    fmt.Sprintf("helper-%d", os.Getpid()), RetryDelay: 100 * time.Millisecond,
		ShutdownTimeout: 20 * time.Second, Logger: logger, Test: worker.TestConfig{Hook: hook},
	})
	if err != nil {
		fail(err)
	}
	fmt.Println("ready")
	err = w.Run(ctx)
	st.Close()
	if err != nil {
		fail(err)
	}
	fmt.Println("drained", w.Stats().Snapshot())
	os.Exit(0)
	return true
}

type helperProc struct {
	cmd    *exec.Cmd
	lines  chan string
	exited chan error
}

// startHelper starts a worker process and waits until it is ready.
func (e *env) startHelper(spec helperSpec) *helperProc {
	e.t.Helper()
	spec.NATSURL, spec.DBURL, spec.DataDir, spec.SandboxURL = e.nats.URL, e.dbURL, e.dataDir, e.sbURL
	raw, _ := json.Marshal(spec)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(raw))
	cmd.Stderr = e.logs
	out, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	h := &helperProc{cmd: cmd, lines: make(chan string, 16), exited: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
		h.exited <- cmd.Wait()
	}()
	e.t.Cleanup(func() { cmd.Process.Kill() })
	select {
	case line := <-h.lines:
		if line != "ready" {
			e.t.Fatalf("helper: %s\n%s", line, e.logs.String())
		}
	case <-time.After(30 * time.Second):
		e.t.Fatal("helper not ready in 30s")
	}
	return h
}

// wait waits for the process to end and returns its last output line and
// exit error.
func (h *helperProc) wait(t *testing.T, timeout time.Duration) (last string, err error) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-h.lines:
			if !ok {
				return last, <-h.exited
			}
			last = strings.TrimSpace(line)
		case <-deadline:
			t.Fatal("helper process did not exit in time")
		}
	}
}
