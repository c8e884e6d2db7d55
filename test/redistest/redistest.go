// Package redistest starts a real redis-server on a free loopback port for tests.
//
// Tests that need Redis never lean on a server that happens to run on the machine: each one
// starts its own with Start and gets it stopped when the test ends. A missing redis-server binary
// fails the test with the install command; it never skips.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Server is one redis-server process owned by a test.
type Server struct {
	t      testing.TB
	port   int
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// portAttempts bounds how many free ports Start tries: a port found free may be taken by another
// test process (go test runs packages in parallel) before redis-server binds it.
const portAttempts = 5

// Start launches redis-server on a free port of 127.0.0.1 and waits until it answers PING.
// The server is stopped in t.Cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not found on PATH; install it with: apt-get install -y redis-server")
	}
	for range portAttempts {
		s := &Server{t: t, port: freePort(t)}
		if err := s.start(); err != nil {
			t.Logf("redis-server on %s: %v; trying another port", s.Addr(), err)
			continue
		}
		t.Cleanup(s.Stop)
		return s
	}
	t.Fatalf("redis-server: no free port it could bind in %d attempts", portAttempts)
	return nil
}

// Addr is the host:port clients connect to.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Stop kills the server (as a crash would) and waits for it to exit. Stop is idempotent; Restart
// brings a stopped server back on the same port with an empty dataset.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Restart starts a stopped server again on the same address; it fails the test if the port was
// taken meanwhile.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		s.t.Fatalf("restart redis-server on %s: %v", s.Addr(), err)
	}
}

// errPortTaken: redis-server could not have the port: it exited at once, or another server
// answers there (a test of another package started its own on the same port first).
var errPortTaken = errors.New("the port is taken")

// start runs redis-server on s.port and waits until it answers, as itself: a server of another
// test answering on the port is not taken for it.
func (s *Server) start() error {
	s.t.Helper()
	cmd := exec.Command("redis-server",
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			s.cmd = nil
			return errPortTaken
		default:
		}
		if pid, err := serverPID(s.Addr()); err == nil {
			if pid == cmd.Process.Pid {
				return nil
			}
			s.Stop()
			return errPortTaken
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Stop()
	s.t.Fatalf("redis-server on %s did not answer within 10s", s.Addr())
	return nil
}

// serverPID asks the Redis server at addr its process id (INFO server).
func serverPID(addr string) (int, error) {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
		return 0, err
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if !strings.HasPrefix(head, "$") || err != nil || n < 0 || n > 1<<20 {
		return 0, fmt.Errorf("unexpected reply %q", head)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(body), "\r\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("no process_id in INFO server")
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
