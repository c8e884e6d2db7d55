package realengine

import "syscall"

// dieWithParent has the kernel kill the engine when the test process dies, so a test binary
// killed by its timeout leaves no engine behind.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
