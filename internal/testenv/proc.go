package testenv

import (
	"os"
	"os/exec"
	"sync"
	"syscall"
)

// Proc is a server process a test owns (postgres, pgbouncer,
// rabbitmq-server, redis-server), started in a process group of its own so
// that Kill reaches every process under it at once: postgres's backends,
// the Erlang VM under rabbitmq-server's script. Kill is a crash, never a
// clean shutdown.
type Proc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	mu     sync.Mutex
	killed bool
}

// StartProc starts cmd in a process group of its own (keeping a Credential
// set in cmd.SysProcAttr), its stdout and stderr appended to the file
// logPath unless logPath is empty. The error is from opening the log or
// from exec.
func StartProc(cmd *exec.Cmd, logPath string) (*Proc, error) {
	var f *os.File
	if logPath != "" {
		var err error
		if f, err = os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = f, f
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		if f != nil {
			f.Close()
		}
		return nil, err
	}
	p := &Proc{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		if f != nil {
			f.Close()
		}
		close(p.exited)
	}()
	return p, nil
}

// Exited is closed once the process has exited (killed or on its own).
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Running reports whether the process has not exited yet.
func (p *Proc) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL to the process group and waits until the process has
// exited. Killing it again, or a process that exited, does nothing.
func (p *Proc) Kill() {
	p.mu.Lock()
	first := !p.killed
	p.killed = true
	p.mu.Unlock()
	if first && p.Running() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-p.exited
}
