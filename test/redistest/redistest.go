// Package redistest starts a real redis-server on a free loopback port for tests.
//
// Tests that need Redis never lean on a server that happens to run on the machine: each one
// starts its own with Start and gets it stopped when the test ends. A missing redis-server binary
// fails the test with the install command; it never skips.
package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// Server is one redis-server process owned by a test.
type Server struct {
	t    testing.TB
	port int
	cmd  *exec.Cmd
}

// Start launches redis-server on a free port of 127.0.0.1 and waits until it answers PING.
// The server is stopped in t.Cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not found on PATH; install it with: apt-get install -y redis-server")
	}
	s := &Server{t: t, port: freePort(t)}
	s.start()
	t.Cleanup(s.Stop)
	return s
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
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart starts a stopped server again on the same address.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}

func (s *Server) start() {
	s.t.Helper()
	cmd := exec.Command("redis-server",
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	s.cmd = cmd
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if ping(s.Addr()) == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Stop()
	s.t.Fatalf("redis-server on %s did not answer PING within 10s", s.Addr())
}

func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("unexpected reply %q", line)
	}
	return nil
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
