package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Where the CPU goes. On this machine every process of the stack shares two
// cores with PostgreSQL, so a checkout's throughput is the cores over the
// CPU it costs all of them together, and pgbench of the same SQL's is the
// cores over what the SQL alone costs PostgreSQL and pgbench. cpuSample
// reads what each group of processes has spent so far from /proc
// (proc_pid_stat(5): utime and stime, and for a parent the cutime and
// cstime of the children it has reaped); the difference of two samples
// over the work done between them is the CPU each unit of work cost.

// clockTicks is sysconf(_SC_CLK_TCK), the unit of /proc's CPU times: 100
// on every Linux architecture Go builds for (USER_HZ).
const clockTicks = 100

// cpuGroups are the groups a sample reports, in order: the stack's
// processes by name, the shared servers by command, the load generators
// (wrk and pgbench, children of this process), and everything else on the
// machine (other sessions, the kernel's threads).
var cpuGroups = []string{"api", "stripe-emulator", "smtp-sink", "dispatcher", "worker",
	"postgres", "rabbitmq", "redis", "load", "other"}

// cpuSample is the CPU time, in clock ticks, each group has used so far,
// and the machine's busy time (/proc/stat: all but idle and iowait).
type cpuSample struct {
	ticks map[string]float64
	busy  float64
}

// sampleCPU reads a cpuSample; s's processes are named by pid. A process
// that ended between two samples takes its CPU with it, unless its parent
// is sampled and reaped it: PostgreSQL's backends are counted through the
// postmaster, and wrk and pgbench through this process.
func sampleCPU(s *stack) (cpuSample, error) {
	smp := cpuSample{ticks: map[string]float64{}}
	pids := map[int]string{}
	if s != nil {
		for name, p := range s.byName {
			if p.cmd != nil && p.cmd.Process != nil {
				pids[p.cmd.Process.Pid] = name
			}
		}
	}
	self := os.Getpid()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return smp, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone since ReadDir
		}
		comm, ppid, own, children, ok := parseStat(string(b))
		if !ok {
			continue
		}
		switch {
		case pids[pid] != "":
			smp.ticks[pids[pid]] += own
		case pid == self:
			smp.ticks["load"] += children // wrk and pgbench, once reaped
		case comm == "postgres":
			smp.ticks["postgres"] += own
			if ppid == 1 || !isPostgres(ppid) {
				smp.ticks["postgres"] += children // the backends that exited
			}
		case comm == "beam.smp" || comm == "epmd" || comm == "erl_child_setup" || comm == "inet_gethost":
			smp.ticks["rabbitmq"] += own
		case comm == "redis-server":
			smp.ticks["redis"] += own
		case comm == "wrk" || comm == "pgbench":
			smp.ticks["load"] += own // still running
		}
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return smp, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	for i := 1; i < len(f) && i <= 8; i++ {
		if i == 4 || i == 5 {
			continue
		}
		v, _ := strconv.ParseFloat(f[i], 64)
		smp.busy += v
	}
	return smp, nil
}

// parseStat reads proc_pid_stat(5): the command, the parent, the process's
// own utime+stime and its reaped children's cutime+cstime, in ticks.
func parseStat(stat string) (comm string, ppid int, own, children float64, ok bool) {
	open, end := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
	if open < 0 || end < open {
		return "", 0, 0, 0, false
	}
	comm = stat[open+1 : end]
	f := strings.Fields(stat[end+1:]) // from field 3, state
	if len(f) < 15 {
		return "", 0, 0, 0, false
	}
	num := func(i int) float64 { v, _ := strconv.ParseFloat(f[i-3], 64); return v }
	ppid = int(num(4))
	return comm, ppid, num(14) + num(15), num(16) + num(17), true
}

func isPostgres(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.TrimSpace(string(b)) == "postgres"
}

// cpuPer records in f, as prefix_<group>_ms, the CPU milliseconds each
// group spent per unit of work between before and after (units of work
// done), "other" being the machine's busy time that no group accounts
// for, and prefix_total_ms the groups' sum without "other".
func cpuPer(f map[string]float64, prefix string, before, after cpuSample, units float64) {
	if units <= 0 {
		return
	}
	ms := func(ticks float64) float64 { return ticks * 1000 / clockTicks / units }
	var sum float64
	for _, g := range cpuGroups[:len(cpuGroups)-1] {
		d := max(after.ticks[g]-before.ticks[g], 0)
		if d == 0 {
			continue
		}
		f[prefix+"_"+g+"_ms"] = ms(d)
		sum += d
	}
	f[prefix+"_total_ms"] = ms(sum)
	f[prefix+"_other_ms"] = ms(max(after.busy-before.busy-sum, 0))
}

// cpuLine is cpuPer's figures as one log line.
func cpuLine(f map[string]float64, prefix string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "CPU ms each: total %.2f =", f[prefix+"_total_ms"])
	for _, g := range cpuGroups[:len(cpuGroups)-1] {
		if v, ok := f[prefix+"_"+g+"_ms"]; ok {
			fmt.Fprintf(&b, " %s %.2f", g, v)
		}
	}
	fmt.Fprintf(&b, "; other processes %.2f", f[prefix+"_other_ms"])
	return b.String()
}
