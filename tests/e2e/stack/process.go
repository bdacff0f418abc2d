package stack

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is one service binary run as a real OS process, so that a test can
// SIGKILL it at any instant and start it again with the same environment.
// Its output goes to a log file (appended across restarts).
type Process struct {
	// Name is the binary's name under cmd/, e.g. "api".
	Name string
	// ReadyURL is polled after a start until it answers 200.
	ReadyURL string

	bin     string
	env     []string
	logPath string

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	starts  int
	killed  int
	logFile *os.File
}

func newProcess(name, binDir, logDir, readyURL string, env []string) *Process {
	return &Process{
		Name:     name,
		ReadyURL: readyURL,
		bin:      filepath.Join(binDir, name),
		env:      env,
		logPath:  filepath.Join(logDir, name+".log"),
	}
}

// Start runs the binary and waits up to 30s for ReadyURL to answer 200. It
// fails when the process exits before that.
func (p *Process) Start() error {
	p.mu.Lock()
	if p.cmd != nil {
		p.mu.Unlock()
		return fmt.Errorf("%s: already running", p.Name)
	}
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.mu.Unlock()
		return err
	}
	fmt.Fprintf(f, "---- start %d at %s ----\n", p.starts+1, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group, so that a Ctrl-C of the test does not reach it
	// first and Kill hits only this process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		p.mu.Unlock()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(exited)
	}()
	p.cmd, p.exited, p.logFile = cmd, exited, f
	p.starts++
	p.mu.Unlock()

	return p.waitReady(exited)
}

func (p *Process) waitReady(exited <-chan struct{}) error {
	if p.ReadyURL == "" {
		return nil
	}
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("%s exited before it was ready; log:\n%s", p.Name, p.LogTail(30))
		default:
		}
		resp, err := client.Get(p.ReadyURL)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready at %s after 30s; log:\n%s", p.Name, p.ReadyURL, p.LogTail(30))
}

// Kill sends SIGKILL (a crash: no drain, no deferred cleanup) and waits for
// the process to be gone. Killing a stopped process is a no-op.
func (p *Process) Kill() {
	p.signal(syscall.SIGKILL, 0)
}

// Stop sends SIGTERM and waits up to 25s for a drain, then SIGKILLs.
func (p *Process) Stop() {
	p.signal(syscall.SIGTERM, 25*time.Second)
}

func (p *Process) signal(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.cmd = nil
	if cmd != nil && sig == syscall.SIGKILL {
		p.killed++
	}
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	if grace > 0 {
		select {
		case <-exited:
			return
		case <-time.After(grace):
			_ = cmd.Process.Kill()
		}
	}
	<-exited
}

// Restart kills the process if it runs and starts it again.
func (p *Process) Restart() error {
	p.Kill()
	return p.Start()
}

// Running reports whether the process was started and has not exited.
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Kills is how many times the process was SIGKILLed.
func (p *Process) Kills() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.killed
}

// LogTail returns the last n lines of the process's log.
func (p *Process) LogTail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// LogContains reports whether the process's log contains s.
func (p *Process) LogContains(s string) bool {
	b, err := os.ReadFile(p.logPath)
	return err == nil && strings.Contains(string(b), s)
}
