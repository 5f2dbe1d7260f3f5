package testenv

import (
	"errors"
	"fmt"
	"net"
	"net/url"
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

// PgBouncerURLParams are what a pgx URL through PgBouncer in transaction
// mode needs: pgx's default exec mode prepares named statements on the
// server connection, which the next transaction may not get (PgBouncer
// before 1.21 keeps no prepared statements across server connections).
// exec runs every statement as the unnamed statement of its own round
// trip.
const PgBouncerURLParams = "default_query_exec_mode=exec"

// PgBouncer is a pgbouncer process in transaction pooling mode, listening on
// 127.0.0.1 on a port of its own, in front of one Postgres server: every
// database name is passed through to the server (the "*" entry). Clients
// log in without a password (auth_type trust); pgbouncer logs in to the
// server as the upstream URL says.
type PgBouncer struct {
	dir  string
	bin  string
	cred *syscall.Credential
	// Port is the port clients connect to, kept across restarts.
	Port int

	mu  sync.Mutex
	cmd *exec.Cmd
	// exited is closed when cmd has been waited for.
	exited chan struct{}
}

var (
	sharedBouncerOnce sync.Once
	sharedBouncer     *PgBouncer
	sharedBouncerErr  error
)

// PgBouncerPostgres is Postgres through PgBouncer: a new, empty database on
// the server Postgres uses, reached through PgBouncerThrough.
func PgBouncerPostgres(t testing.TB) string {
	t.Helper()
	return PgBouncerThrough(t, Postgres(t))
}

// PgBouncerThrough is the URL that reaches the database of direct (a URL
// from Postgres) through a pgbouncer in transaction mode started once per
// test binary in front of its server (the process dies with the binary),
// with PgBouncerURLParams. A machine without pgbouncer skips the test
// (fails it in CI).
func PgBouncerThrough(t testing.TB, direct string) string {
	t.Helper()
	sharedBouncerOnce.Do(func() {
		sharedBouncer, sharedBouncerErr = startPgBouncer(direct)
	})
	if sharedBouncerErr != nil {
		Missing(t, "no PgBouncer: %v; install pgbouncer (Debian's package)", sharedBouncerErr)
	}
	return sharedBouncer.Through(t, direct)
}

// StartPgBouncer starts a pgbouncer in transaction mode in front of the
// server of upstream (a Postgres URL; its user and password are the ones
// pgbouncer logs in with) for this test alone, and stops it when the test
// ends. A machine without pgbouncer skips the test (fails it in CI).
func StartPgBouncer(t testing.TB, upstream string) *PgBouncer {
	t.Helper()
	b, err := startPgBouncer(upstream)
	if err != nil {
		Missing(t, "cannot start PgBouncer: %v; install pgbouncer (Debian's package)", err)
	}
	t.Cleanup(func() {
		b.Kill()
		os.RemoveAll(b.dir)
	})
	return b
}

// PgBouncerVersion is the output of `pgbouncer --version`'s first line, or
// an error when there is no pgbouncer.
func PgBouncerVersion() (string, error) {
	bin, err := pgbouncerBin()
	if err != nil {
		return "", err
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "", err
	}
	first, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(first), nil
}

func pgbouncerBin() (string, error) {
	for _, p := range []string{"pgbouncer", "/usr/sbin/pgbouncer"} {
		if path, err := exec.LookPath(p); err == nil {
			return path, nil
		}
	}
	return "", errors.New("pgbouncer not found on PATH or in /usr/sbin")
}

func startPgBouncer(upstream string) (*PgBouncer, error) {
	bin, err := pgbouncerBin()
	if err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(upstream)
	if err != nil {
		return nil, err
	}
	reapPgBouncers()
	b := &PgBouncer{bin: bin}
	if b.dir, err = os.MkdirTemp("", "toolq-pgbouncer-"); err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		// pgbouncer refuses to run as root.
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, errors.New("running as root and there is no 'postgres' user to run pgbouncer as")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		b.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(b.dir, uid, gid); err != nil {
			return nil, err
		}
	}
	if b.Port, err = FreePort(); err != nil {
		return nil, err
	}
	server := fmt.Sprintf("host=%s port=%d user=%s", cfg.Host, cfg.Port, cfg.User)
	if cfg.Password != "" {
		server += " password=" + cfg.Password
	}
	ini := fmt.Sprintf(`[databases]
* = %s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
max_client_conn = 2000
default_pool_size = 20
reserve_pool_size = 0
server_login_retry = 1
server_idle_timeout = 10
logfile = %s
admin_users = %s
`, server, b.Port, filepath.Join(b.dir, "userlist.txt"), filepath.Join(b.dir, "pgbouncer.log"), cfg.User)
	files := map[string]string{
		"pgbouncer.ini": ini,
		"userlist.txt":  fmt.Sprintf("%q \"\"\n", cfg.User),
		"owner.pid":     strconv.Itoa(os.Getpid()),
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(b.dir, name), []byte(body), 0o644); err != nil {
			return nil, err
		}
	}
	if err := b.Start(); err != nil {
		os.RemoveAll(b.dir)
		return nil, err
	}
	return b, nil
}

// Through is the URL of the database of direct (a URL of the server the
// pgbouncer is in front of) through the pgbouncer, with
// PgBouncerURLParams.
func (b *PgBouncer) Through(t testing.TB, direct string) string {
	t.Helper()
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	u.Host = b.Addr()
	q := u.Query()
	q.Del("password") // pgbouncer logs clients in without one
	params, _ := url.ParseQuery(PgBouncerURLParams)
	for k := range params {
		q.Set(k, params.Get(k))
	}
	u.User = url.User(u.User.Username())
	u.RawQuery = q.Encode()
	return u.String()
}

// Addr is host:port of the pgbouncer.
func (b *PgBouncer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port)) }

// Log is pgbouncer's log so far (for a failure message).
func (b *PgBouncer) Log() string {
	raw, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	return tail(raw)
}

// Start starts pgbouncer (again) on its port and waits until it accepts
// connections.
func (b *PgBouncer) Start() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd != nil {
		return errors.New("pgbouncer already runs")
	}
	cmd := exec.Command(b.bin, filepath.Join(b.dir, "pgbouncer.ini"))
	cmd.Dir = b.dir
	// Killed with the test binary, whatever way it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred, Pdeathsig: syscall.SIGKILL}
	out, err := os.OpenFile(filepath.Join(b.dir, "stderr"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", b.Addr(), time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-exited:
			raw, _ := os.ReadFile(filepath.Join(b.dir, "stderr"))
			return fmt.Errorf("pgbouncer exited at start: %s%s", tail(raw), b.Log())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			return fmt.Errorf("pgbouncer did not listen on %s within 15s: %s", b.Addr(), b.Log())
		}
	}
	b.cmd, b.exited = cmd, exited
	return nil
}

// Kill stops pgbouncer with SIGKILL, as a crash would: every client and
// server connection drops at once. It waits until the process is gone. It
// does nothing when pgbouncer is not running.
func (b *PgBouncer) Kill() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return
	}
	b.cmd.Process.Kill()
	<-b.exited
	b.cmd = nil
}

// Restart kills pgbouncer and starts it again on the same port after down.
func (b *PgBouncer) Restart(down time.Duration) error {
	b.Kill()
	time.Sleep(down)
	return b.Start()
}

// reapPgBouncers removes the directories of pgbouncers whose test binary is
// gone (the process itself died with it: Pdeathsig).
func reapPgBouncers() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "toolq-pgbouncer-*"))
	for _, dir := range dirs {
		raw, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(string(raw))
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue
		}
		os.RemoveAll(dir)
	}
}
