//go:build !linux

package realengine

import "syscall"

// dieWithParent: only Linux can tie the engine's life to the test process's.
func dieWithParent() *syscall.SysProcAttr { return nil }
