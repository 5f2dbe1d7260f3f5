package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Formation is a highly available Postgres built by pg_auto_failover
// (Debian's postgresql-15-auto-failover): a monitor and two nodes, a
// primary and a synchronous secondary, each a pg_autoctl keeper with its
// Postgres, in a temporary directory, listening on 127.0.0.1 with trust
// authentication. When the monitor finds the primary gone it promotes the
// secondary. Its monitor fails over quickly (a node unhealthy after 3 s,
// the new primary writable after 5 s: see FormationMonitorSettings).
type Formation struct {
	dir     string
	bin     string // the PostgreSQL server binaries (pg_ctl)
	autoctl string
	cred    *syscall.Credential
	// Database is the database the nodes serve, created by pg_autoctl.
	Database string
	monitor  *afNode
	// Nodes are the two data nodes, node1 first (the first primary).
	Nodes []*afNode
}

type afNode struct {
	Name string
	Port int
	dir  string
	args []string // pg_autoctl's arguments after "create"

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// FormationMonitorSettings are the monitor's settings for a test: health
// checks every second, a node unhealthy after 3 s without a report, and a
// promoted secondary that waits 5 s (not 30) for the old primary to demote
// itself before it takes writes. The keepers' network_partition_timeout is
// lowered to 3 s to match: a primary cut from the monitor and its standby
// stops taking writes before the standby is allowed to.
var FormationMonitorSettings = map[string]string{
	"pgautofailover.health_check_period":               "1000",
	"pgautofailover.health_check_timeout":              "1000",
	"pgautofailover.health_check_max_retries":          "1",
	"pgautofailover.health_check_retry_delay":          "500",
	"pgautofailover.node_considered_unhealthy_timeout": "3000",
	"pgautofailover.primary_demote_timeout":            "5000",
}

// AutoFailoverBin is the path of pg_autoctl, or an error when
// pg_auto_failover is not installed.
func AutoFailoverBin() (string, error) {
	if p, err := exec.LookPath("pg_autoctl"); err == nil {
		return p, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_autoctl")
	if len(matches) > 0 {
		return matches[len(matches)-1], nil
	}
	return "", errors.New("pg_autoctl not found on PATH or under /usr/lib/postgresql (apt-get install postgresql-15-auto-failover)")
}

// StartFormation starts a monitor, a primary and its synchronous
// secondary for this test alone, and waits until the monitor reports them
// primary and secondary. Everything is killed and removed when the test
// ends. A machine without pg_auto_failover skips the test (fails it in
// CI).
func StartFormation(t testing.TB) *Formation {
	t.Helper()
	f, err := startFormation()
	if f != nil {
		t.Cleanup(f.destroy)
	}
	if err != nil {
		if f == nil {
			Missing(t, "no pg_auto_failover formation: %v", err)
		}
		t.Fatalf("testenv: formation: %v\n%s", err, f.Logs())
	}
	return f
}

func startFormation() (*Formation, error) {
	autoctl, err := AutoFailoverBin()
	if err != nil {
		return nil, err
	}
	bin, err := postgresBinDir()
	if err != nil {
		return nil, err
	}
	reapFormations()
	f := &Formation{bin: bin, autoctl: autoctl, Database: "toolq"}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, errors.New("running as root and there is no 'postgres' user to run pg_autoctl as")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		f.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	if f.dir, err = os.MkdirTemp("", "toolq-formation-"); err != nil {
		return nil, err
	}
	if f.cred != nil {
		if err := os.Chown(f.dir, int(f.cred.Uid), int(f.cred.Gid)); err != nil {
			return nil, err
		}
	}
	// Who owns the formation, so that a later run can kill it if this test
	// binary dies without cleaning up (the keepers die with it: Pdeathsig;
	// their Postgres does not).
	if err := os.WriteFile(filepath.Join(f.dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return f, err
	}
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = FreePort(); err != nil {
			return nil, err
		}
	}
	f.monitor = &afNode{Name: "monitor", Port: ports[0], dir: filepath.Join(f.dir, "monitor")}
	f.monitor.args = []string{"monitor", "--pgdata", f.monitor.dir, "--pgport", strconv.Itoa(ports[0]),
		"--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl"}
	if err := f.start(f.monitor, append(append([]string{"create"}, f.monitor.args...), "--run")); err != nil {
		return f, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := f.configureMonitor(ctx); err != nil {
		return f, err
	}
	monitorURI := fmt.Sprintf("postgres://autoctl_node@127.0.0.1:%d/pg_auto_failover?sslmode=disable", ports[0])
	for i := 1; i <= 2; i++ {
		n := &afNode{Name: fmt.Sprintf("node%d", i), Port: ports[i], dir: filepath.Join(f.dir, fmt.Sprintf("node%d", i))}
		n.args = []string{"postgres", "--pgdata", n.dir, "--pgport", strconv.Itoa(n.Port), "--hostname", "127.0.0.1",
			"--name", n.Name, "--auth", "trust", "--no-ssl", "--dbname", f.Database, "--monitor", monitorURI}
		f.Nodes = append(f.Nodes, n)
		// pg_basebackup of the secondary waits for a spread checkpoint on
		// the primary (minutes): ask the primary for one at once.
		stop := make(chan struct{})
		var hurry sync.WaitGroup
		if i == 2 {
			hurry.Add(1)
			go func() { defer hurry.Done(); f.checkpointUntil(stop, f.Nodes[0]) }()
		}
		if err := f.start(n, append(append([]string{"create"}, n.args...), "--run")); err != nil {
			return f, err
		}
		err := f.waitNodes(ctx, i)
		close(stop)
		hurry.Wait()
		if err != nil {
			return f, err
		}
	}
	for _, n := range f.Nodes {
		if err := f.autoctl1("config", "set", "--pgdata", n.dir, "timeout.network_partition_timeout", "3"); err != nil {
			return f, err
		}
	}
	if err := f.WaitHealthy(ctx); err != nil {
		return f, err
	}
	return f, nil
}

func (f *Formation) configureMonitor(ctx context.Context) error {
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/pg_auto_failover?sslmode=disable", f.monitor.Port)
	var conn *pgx.Conn
	var err error
	for conn == nil {
		if conn, err = pgx.Connect(ctx, url); err != nil {
			select {
			case <-ctx.Done():
				return fmt.Errorf("the monitor: %v", err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	defer conn.Close(context.Background())
	for name, value := range FormationMonitorSettings {
		if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER SYSTEM SET %s = %s", name, value)); err != nil {
			return fmt.Errorf("the monitor: %s: %v", name, err)
		}
	}
	_, err = conn.Exec(ctx, "SELECT pg_reload_conf()")
	return err
}

func (f *Formation) checkpointUntil(stop <-chan struct{}, n *afNode) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(500 * time.Millisecond):
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if conn, err := pgx.Connect(ctx, n.url("postgres")); err == nil {
			conn.Exec(ctx, "CHECKPOINT")
			conn.Close(ctx)
		}
		cancel()
	}
}

func (n *afNode) url(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", n.Port, database)
}

func (f *Formation) command(args ...string) *exec.Cmd {
	cmd := exec.Command(f.autoctl, args...)
	cmd.Dir = f.dir
	cmd.Env = append(os.Environ(),
		"PATH="+f.bin+":/usr/bin:/bin",
		"XDG_CONFIG_HOME="+filepath.Join(f.dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(f.dir, "share"),
		"HOME="+f.dir)
	// Each keeper and its Postgres in a process group of its own: Kill
	// takes them all at once, as the loss of the machine would.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: f.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}

func (f *Formation) autoctl1(args ...string) error {
	out, err := f.command(args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_autoctl %s: %v: %s", strings.Join(args[:2], " "), err, tail(out))
	}
	return nil
}

// waitNodes waits until the monitor has n nodes, the last of them no
// longer initialising (a primary in wait_primary or primary, a secondary
// catching up or caught up).
func (f *Formation) waitNodes(ctx context.Context, n int) error {
	want := map[string]bool{"single": n == 1, "wait_primary": true, "primary": true, "secondary": n > 1, "catchingup": n > 1}
	for {
		states, err := f.States(ctx)
		if err == nil && len(states) == n && want[states[f.Nodes[n-1].Name][0]] {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not join the formation: %v (states %v, %v)", f.Nodes[n-1].Name, ctx.Err(), states, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// start runs pg_autoctl with args as the node's keeper (create … --run,
// or run), which starts its Postgres.
func (f *Formation) start(n *afNode, args []string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return fmt.Errorf("%s already runs", n.Name)
	}
	cmd := f.command(args...)
	log, err := os.OpenFile(filepath.Join(f.dir, n.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return err
	}
	n.exited = make(chan struct{})
	exited := n.exited
	go func() { cmd.Wait(); close(exited) }()
	n.cmd = cmd
	return nil
}

// kill sends SIGKILL to the node's process group: the keeper, its
// Postgres and every backend, at once. It waits for the keeper.
func (n *afNode) kill() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
	<-n.exited
	n.cmd = nil
	// Whatever of the group outlived the keeper (its Postgres, restarted by
	// a service a moment before the signal).
	syscall.Kill(-n.pgid(), syscall.SIGKILL)
	return true
}

// pgid is the process group of the node's Postgres, from postmaster.pid.
func (n *afNode) pgid() int {
	raw, err := os.ReadFile(filepath.Join(n.dir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(raw), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0
	}
	pgid, err := syscall.Getpgid(pid)
	if err != nil || pgid == os.Getpid() || pgid == syscall.Getpgrp() {
		return 0
	}
	return pgid
}

func (f *Formation) destroy() {
	for _, n := range append([]*afNode{f.monitor}, f.Nodes...) {
		if n != nil {
			n.kill()
			if g := n.pgid(); g > 0 {
				syscall.Kill(-g, syscall.SIGKILL)
			}
		}
	}
	if os.Getenv("TOOLQ_KEEP_FORMATION") == "" {
		os.RemoveAll(f.dir)
	}
}

// reapFormations kills and removes the formations of test binaries that
// died without doing so.
func reapFormations() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "toolq-formation-*"))
	for _, dir := range dirs {
		raw, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(string(raw))
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue // the owner still runs
		}
		for _, name := range []string{"monitor", "node1", "node2"} {
			if g := (&afNode{dir: filepath.Join(dir, name)}).pgid(); g > 0 {
				syscall.Kill(-g, syscall.SIGKILL)
			}
		}
		os.RemoveAll(dir)
	}
}

// URL is the multi-host URL of the formation's database that a consumer
// takes: both nodes, and target_session_attrs=read-write so that pgx
// connects to whichever is the primary.
func (f *Formation) URL() string {
	hosts := make([]string, len(f.Nodes))
	for i, n := range f.Nodes {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", n.Port)
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write", strings.Join(hosts, ","), f.Database)
}

// NodeAddr is host:port of node i.
func (f *Formation) NodeAddr(i int) string { return fmt.Sprintf("127.0.0.1:%d", f.Nodes[i].Port) }

// NodeURL is the URL of the formation's database on node i alone.
func (f *Formation) NodeURL(i int) string { return f.Nodes[i].url(f.Database) }

// Primary is the index of the node the monitor has as primary (reported
// and assigned), or -1.
func (f *Formation) Primary(ctx context.Context) (int, error) {
	states, err := f.States(ctx)
	if err != nil {
		return -1, err
	}
	for i, n := range f.Nodes {
		if s := states[n.Name]; s == [2]string{"primary", "primary"} {
			return i, nil
		}
	}
	return -1, nil
}

// States are each node's reported and assigned state, as the monitor has
// them.
func (f *Formation) States(ctx context.Context) (map[string][2]string, error) {
	conn, err := pgx.Connect(ctx, f.monitor.url("pg_auto_failover"))
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, "SELECT nodename, reportedstate::text, goalstate::text FROM pgautofailover.node")
	if err != nil {
		return nil, err
	}
	out := map[string][2]string{}
	for rows.Next() {
		var name, reported, goal string
		if err := rows.Scan(&name, &reported, &goal); err != nil {
			return nil, err
		}
		out[name] = [2]string{reported, goal}
	}
	return out, rows.Err()
}

// WaitHealthy waits until the monitor reports one node primary and the
// other secondary (synchronous: pg_auto_failover's default quorum), both
// as assigned.
func (f *Formation) WaitHealthy(ctx context.Context) error {
	var last map[string][2]string
	for {
		states, err := f.States(ctx)
		if err == nil {
			last = states
			var primaries, secondaries int
			for _, s := range states {
				switch s {
				case [2]string{"primary", "primary"}:
					primaries++
				case [2]string{"secondary", "secondary"}:
					secondaries++
				}
			}
			if primaries == 1 && secondaries == len(f.Nodes)-1 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the formation did not become primary and secondary: %v (last states %v)", ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// KillPrimary kills the primary node (SIGKILL to its keeper, its Postgres
// and every backend) and returns its index.
func (f *Formation) KillPrimary(ctx context.Context) (int, error) {
	i, err := f.Primary(ctx)
	if err != nil {
		return -1, err
	}
	if i < 0 {
		return -1, errors.New("the formation has no primary")
	}
	f.Nodes[i].kill()
	return i, nil
}

// Restart starts node i's keeper again after a kill: it rejoins the
// formation (as a secondary, once the monitor has promoted the other).
func (f *Formation) Restart(i int) error {
	return f.start(f.Nodes[i], []string{"run", "--pgdata", f.Nodes[i].dir})
}

// State is `pg_autoctl show state`, for a log or a failure message.
func (f *Formation) State() string {
	out, err := f.command("show", "state", "--pgdata", f.monitor.dir).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("pg_autoctl show state: %v: %s", err, tail(out))
	}
	return string(out)
}

// Logs are the tails of the monitor's and the nodes' logs.
func (f *Formation) Logs() string {
	var b strings.Builder
	for _, name := range []string{"monitor", "node1", "node2"} {
		raw, _ := os.ReadFile(filepath.Join(f.dir, name+".log"))
		if len(raw) > 3000 {
			raw = raw[len(raw)-3000:]
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", name, raw)
	}
	return b.String()
}

// HoldReplication stops (SIGSTOP) the primary's WAL senders, so that
// nothing the primary commits from now on reaches the secondary (a commit
// that waits for the synchronous secondary waits), until resume continues
// them. It is how a test makes sure that a commit that did not wait for
// the secondary is lost when the primary is then killed.
func (f *Formation) HoldReplication(ctx context.Context) (resume func(), err error) {
	conn, err := pgx.Connect(ctx, f.URL())
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, "SELECT pid FROM pg_stat_replication")
	if err != nil {
		return nil, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, err
	}
	if len(pids) == 0 {
		return nil, errors.New("the primary has no WAL sender")
	}
	for _, pid := range pids {
		if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
			return nil, fmt.Errorf("stopping the WAL sender %d: %v", pid, err)
		}
	}
	return func() {
		for _, pid := range pids {
			syscall.Kill(int(pid), syscall.SIGCONT)
		}
	}, nil
}
