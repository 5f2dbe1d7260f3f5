package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPU accounting, per process of the machine, from /proc: what a job costs
// the consumer, the driver (this process: the publisher, the result watch,
// the sandbox), nats-server and Postgres, so that a scenario's cost is
// seen where it is paid. Where there is no /proc the figures are 0.

// cpuSample is the CPU seconds used so far by each part of the machine,
// and the machine's time (machineTime).
type cpuSample struct {
	driver, nats, postgres float64
	machineTime
}

// sampleCPU reads the CPU used so far by this process, the nats-server
// process natsPID (0: unknown) and the Postgres server whose postmaster is
// pgPID (0: unknown), and by the whole machine.
func sampleCPU(natsPID, pgPID int) cpuSample {
	s := cpuSample{driver: cpuSeconds(), machineTime: readMachineTime()}
	if natsPID > 0 {
		s.nats, _ = procCPU(natsPID, false)
	}
	if pgPID > 0 {
		s.postgres = postgresCPU(pgPID)
	}
	return s
}

// procCPU is the CPU seconds a process has used (utime + stime), with its
// exited, reaped children's when children is set.
func procCPU(pid int, children bool) (float64, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	last := 15 // utime, stime (fields 14 and 15)
	if children {
		last = 17 // cutime, cstime
	}
	var ticks int64
	for i := 14; i <= last; i++ {
		n, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += n
	}
	return float64(ticks) / 100, nil // USER_HZ
}

// procStat is /proc/PID/stat's fields, numbered as in proc(5) (f[1] is the
// pid, f[2] the command, f[4] the parent's pid).
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(b)
	end := strings.LastIndexByte(s, ')') // the command may hold spaces and parentheses
	if end < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	f := append([]string{"", strconv.Itoa(pid), s[strings.IndexByte(s, '(')+1 : end]}, strings.Fields(s[end+1:])...)
	if len(f) < 18 {
		return nil, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	return f, nil
}

// postgresCPU is the CPU seconds a Postgres server has used: its
// postmaster's, with the backends that have exited (the postmaster reaps
// them), and the processes it runs now.
func postgresCPU(postmaster int) float64 {
	total, err := procCPU(postmaster, true)
	if err != nil {
		return 0
	}
	entries, _ := os.ReadDir("/proc")
	want := strconv.Itoa(postmaster)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f, err := procStat(pid); err == nil && f[4] == want {
			c, _ := procCPU(pid, false)
			total += c
		}
	}
	return total
}

// postmasterPID finds the pid of the ledger's Postgres server when it runs
// on this machine: the parent of its checkpointer. 0 when it cannot.
func (b *bench) postmasterPID(ctx context.Context) int {
	var pid int
	if err := b.pg.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'`).Scan(&pid); err != nil {
		return 0
	}
	f, err := procStat(pid)
	if err != nil || f[2] != "postgres" {
		return 0 // another machine's, or not visible here
	}
	ppid, _ := strconv.Atoi(f[4])
	return ppid
}

// machineTime is the time of all the machine's CPUs so far, in seconds:
// what its processes used (busy: user, nice, system, irq, softirq), what
// the hypervisor gave to other machines while this one had work to run
// (steal), and all of it (idle and iowait too). On a shared VM steal moves
// from second to second, and every process's speed with it.
type machineTime struct {
	machine, steal, all float64
}

// readMachineTime reads the machine's time from /proc/stat (zero where
// there is none).
func readMachineTime() machineTime {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineTime{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return parseMachineTime(line)
}

// parseMachineTime reads /proc/stat's first line: "cpu user nice system
// idle iowait irq softirq steal guest guest_nice", in USER_HZ ticks
// (guest time is counted in user already). The ticks are added up before
// they become seconds, so that each figure rounds once.
func parseMachineTime(line string) machineTime {
	f := strings.Fields(line)
	var busy, steal, all int64
	for i := 1; i < len(f) && i <= 8; i++ {
		n, _ := strconv.ParseInt(f[i], 10, 64)
		all += n
		switch i {
		case 4, 5: // idle, iowait
		case 8:
			steal += n
		default:
			busy += n
		}
	}
	const userHZ = 100
	return machineTime{machine: float64(busy) / userHZ, steal: float64(steal) / userHZ, all: float64(all) / userHZ}
}

// machineCPUSeconds is the CPU time every process of the machine has used,
// 0 where there is no /proc.
func machineCPUSeconds() float64 { return readMachineTime().machine }

// since is the machine's time from an earlier reading to t: zero when
// either was not read (readMachineTime's zero), never the time since the
// machine booted.
func (t machineTime) since(from machineTime) machineTime {
	if from.all <= 0 || t.all <= from.all {
		return machineTime{}
	}
	return machineTime{machine: t.machine - from.machine, steal: t.steal - from.steal, all: t.all - from.all}
}

// stealPct is the share of the time t that the hypervisor took (0 for no
// time).
func (t machineTime) stealPct() float64 {
	if t.all <= 0 {
		return 0
	}
	return 100 * t.steal / t.all
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func peakRSSMiB() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Maxrss) / 1024 // KiB on Linux
}
