package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDatabaseURL names a Postgres server (any database on it; the harness
// creates one database per test there) to use instead of a throwaway cluster.
const EnvDatabaseURL = "TOOLQ_TEST_DATABASE_URL"

var (
	sharedOnce    sync.Once
	sharedCluster *Cluster
	sharedErr     error
	dbCounter     atomic.Int64
)

// Main runs the tests of a package and stops the shared Postgres cluster
// afterwards, whether they passed or not, then runs cleanups (the
// package's own: built binaries, say). Call it from TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
func Main(m *testing.M, cleanups ...func()) {
	code := m.Run()
	if sharedCluster != nil {
		sharedCluster.Stop()
		os.RemoveAll(sharedCluster.dir)
	}
	for _, c := range cleanups {
		c()
	}
	os.Exit(code)
}

// Postgres returns the URL of a new, empty database for the test, dropped when
// the test ends. The server is the one named by TOOLQ_TEST_DATABASE_URL, or
// else a throwaway cluster started once per test binary (see Main).
func Postgres(t testing.TB) string {
	t.Helper()
	base := os.Getenv(EnvDatabaseURL)
	if base == "" {
		sharedOnce.Do(func() { sharedCluster, sharedErr = StartCluster() })
		if sharedErr != nil {
			Missing(t, "no Postgres: %v; set %s or install the PostgreSQL server binaries (initdb, pg_ctl)", sharedErr, EnvDatabaseURL)
		}
		base = sharedCluster.URL("postgres")
	}
	return createDatabase(t, base)
}

// OwnCluster starts a cluster for this test alone, for tests that stop and
// start the server. It is stopped and removed when the test ends. Settings
// ("name=value") apply after the defaults: "synchronous_commit=on" makes
// every commit that waits survive Crash (the WAL reaches the kernel before
// the commit returns; fsync stays off, for the machine does not crash).
func OwnCluster(t testing.TB, settings ...string) *Cluster {
	t.Helper()
	c, err := startCluster(false, settings...)
	if err != nil {
		Missing(t, "cannot start a Postgres cluster: %v", err)
	}
	t.Cleanup(func() {
		c.Stop()
		os.RemoveAll(c.dir)
	})
	return c
}

func createDatabase(t testing.TB, base string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(base)
	if err != nil {
		t.Fatalf("testenv: %s: %v", EnvDatabaseURL, err)
	}
	admin, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		Missing(t, "cannot connect to Postgres at %s:%d: %v", cfg.Host, cfg.Port, err)
	}
	defer admin.Close(context.Background())
	name := fmt.Sprintf("toolq_test_%d_%d_%d", os.Getpid(), time.Now().UnixNano()%1e6, dbCounter.Add(1))
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("testenv: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if conn, err := pgx.ConnectConfig(ctx, cfg); err == nil {
			conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			conn.Close(ctx)
		}
	})
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", cfg.User, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), name) + passwordParam(cfg.Password)
}

func passwordParam(pw string) string {
	if pw == "" {
		return ""
	}
	return "&password=" + pw
}

// Cluster is a throwaway Postgres cluster in a temporary directory, listening
// on 127.0.0.1 on a free port, with trust authentication and durability off
// (it lives for one test run).
type Cluster struct {
	dir      string
	bin      string
	Port     int
	cred     *syscall.Credential // run as this user (initdb refuses root)
	durable  bool
	settings []string // server settings after the defaults
}

// StartCluster runs initdb and starts the server, with fsync and
// synchronous commit off: fast, for tests.
func StartCluster() (*Cluster, error) { return startCluster(false) }

// StartDurableCluster is StartCluster with fsync and synchronous commit on,
// as a production server runs: for benchmarks. Settings ("name=value")
// apply after the defaults.
func StartDurableCluster(settings ...string) (*Cluster, error) {
	return startCluster(true, settings...)
}

func startCluster(durable bool, settings ...string) (*Cluster, error) {
	bin, err := postgresBinDir()
	if err != nil {
		return nil, err
	}
	c := &Cluster{bin: bin, durable: durable, settings: settings}
	reapOrphans(bin)
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, errors.New("running as root and there is no 'postgres' user to run initdb as")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	if c.dir, err = os.MkdirTemp("", "toolq-pg-"); err != nil {
		return nil, err
	}
	if c.cred != nil {
		if err := os.Chown(c.dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return nil, err
		}
	}
	// Who owns the cluster, so that a later run can stop it if this test
	// binary dies without cleaning up (a panic, a timeout, a kill).
	if err := os.WriteFile(filepath.Join(c.dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, err
	}
	if err := c.exec("initdb", "-D", c.dataDir(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--locale=C"); err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	if c.Port, err = FreePort(); err != nil {
		return nil, err
	}
	if err := c.Start(); err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	return c, nil
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }

// URL is the connection URL of a database on the cluster.
func (c *Cluster) URL(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.Port, database)
}

// Database creates a new database on this cluster for the test.
func (c *Cluster) Database(t testing.TB) string {
	t.Helper()
	return createDatabase(t, c.URL("postgres"))
}

// Start starts the server (again) on its port and waits until it accepts
// connections.
func (c *Cluster) Start() error {
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -k %s -c fsync=off -c synchronous_commit=off "+
		"-c full_page_writes=off -c max_connections=300", c.Port, c.dir)
	if c.durable {
		opts = fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -k %s -c max_connections=300", c.Port, c.dir)
	}
	for _, s := range c.settings {
		opts += " -c " + s
	}
	return c.exec("pg_ctl", "-D", c.dataDir(), "-l", filepath.Join(c.dir, "log"), "-o", opts, "-w", "-t", "60", "start")
}

// Stop stops the server (pg_ctl stop -m fast: clients are disconnected, what
// was committed is kept) and waits.
func (c *Cluster) Stop() error {
	return c.exec("pg_ctl", "-D", c.dataDir(), "-m", "fast", "-w", "stop")
}

// Crash stops the server as a crash would (pg_ctl stop -m immediate: every
// process quits at once, no checkpoint, and what is still in the WAL
// buffers, such as a commit that did not wait for the disk, is lost);
// Start recovers it from the WAL.
func (c *Cluster) Crash() error {
	return c.exec("pg_ctl", "-D", c.dataDir(), "-m", "immediate", "-w", "stop")
}

func (c *Cluster) exec(name string, args ...string) error {
	cmd := exec.Command(filepath.Join(c.bin, name), args...)
	cmd.Dir = c.dir
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", name, err, tail(out))
	}
	return nil
}

func tail(b []byte) string {
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return string(b)
}

// postgresBinDir finds initdb and pg_ctl on PATH or in Debian's versioned
// directories.
func postgresBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) > 0 {
		return filepath.Dir(matches[len(matches)-1]), nil
	}
	return "", errors.New("initdb and pg_ctl not found on PATH or under /usr/lib/postgresql")
}

// FreePort is a TCP port on the loopback interface that nothing listened
// on a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// reapOrphans stops and removes the clusters of test binaries that died
// without stopping them.
func reapOrphans(bin string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "toolq-pg-*"))
	for _, dir := range dirs {
		raw, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(string(raw))
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue // the owner still runs
		}
		c := &Cluster{dir: dir, bin: bin}
		if info, err := os.Stat(dir); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok && st.Uid != uint32(os.Geteuid()) {
				c.cred = &syscall.Credential{Uid: st.Uid, Gid: st.Gid}
			}
		}
		c.exec("pg_ctl", "-D", c.dataDir(), "-m", "immediate", "-w", "stop")
		os.RemoveAll(dir)
	}
}

// Destroy stops the server and removes its directory.
func (c *Cluster) Destroy() {
	c.Stop()
	os.RemoveAll(c.dir)
}
