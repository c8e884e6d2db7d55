package test

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/usherllm/usher/test/testlog"
)

// serveProcess is one `usher serve` process of the real binary, listening on a free loopback
// port, with its log kept for the test to read.
type serveProcess struct {
	t          *testing.T
	name       string
	cmd        *exec.Cmd
	url        string // http://127.0.0.1:port
	configPath string
	log        *lockedBuffer
	exited     chan struct{} // closed when the process has exited; then exitErr is set
	exitErr    error
}

// lockedBuffer is a bytes.Buffer safe for one writer and many readers.
type lockedBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// freeAddr returns a loopback address with a port free at the time of the call.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startServe writes config(listen) to a file and runs `usher serve` on it until /healthz
// answers. The process is killed when the test ends if it is still running; when the test
// fails, its log is handed over by testlog (a file, or the output under -v).
func startServe(t *testing.T, name string, config func(listen string) string) *serveProcess {
	t.Helper()
	return startServeCommand(t, name, config, func(bin, configPath string) *exec.Cmd {
		return exec.Command(bin, "serve", "--config", configPath)
	})
}

// startServeCommand is startServe running the command that command makes of the binary and the
// config file's path.
func startServeCommand(t *testing.T, name string, config func(listen string) string, command func(bin, configPath string) *exec.Cmd) *serveProcess {
	t.Helper()
	bin := usherBinary(t)
	listen := freeAddr(t)
	p := &serveProcess{t: t, name: name, url: "http://" + listen, log: &lockedBuffer{}, exited: make(chan struct{}),
		configPath: filepath.Join(t.TempDir(), "usher.yaml")}
	p.writeConfig(config(listen))
	p.cmd = command(bin, p.configPath)
	if p.cmd.Dir == "" {
		// A config without a database gets the default sqlite:usher.db, relative to the working
		// directory: each process gets its own, not one file shared by every test and run.
		p.cmd.Dir = filepath.Dir(p.configPath)
	}
	p.cmd.Stderr = p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exitErr = p.cmd.Wait(); close(p.exited) }()
	testlog.OnFailure(t, name, p.log.String)
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(p.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case <-p.exited:
			t.Fatalf("%s exited before serving: %v", name, p.exitErr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: /healthz not OK within 20s", name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *serveProcess) writeConfig(yaml string) {
	p.t.Helper()
	if err := os.WriteFile(p.configPath, []byte(yaml), 0o600); err != nil {
		p.t.Fatal(err)
	}
}

func (p *serveProcess) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("%s: signal %v: %v", p.name, sig, err)
	}
}

// exitCode waits for the process to exit and returns its exit code.
func (p *serveProcess) exitCode(within time.Duration) int {
	p.t.Helper()
	select {
	case <-p.exited:
	case <-time.After(within):
		p.t.Fatalf("%s did not exit within %v", p.name, within)
	}
	var ee *exec.ExitError
	switch {
	case p.exitErr == nil:
		return 0
	case errors.As(p.exitErr, &ee):
		return ee.ExitCode()
	}
	p.t.Fatalf("%s: %v", p.name, p.exitErr)
	return -1
}

// waitLog waits until the process's log contains s.
func (p *serveProcess) waitLog(s string, within time.Duration) {
	p.t.Helper()
	eventually(p.t, within, p.name+" logs "+s, func() bool { return strings.Contains(p.log.String(), s) })
}

// freshClient opens a new connection for every request, as a new client behind a load balancer
// would.
func freshClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
}
