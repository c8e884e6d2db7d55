//go:build linux || darwin

package gateway

import "syscall"

// openFileLimit is the process's limit on open file descriptors (RLIMIT_NOFILE, which the Go
// runtime raises to the hard limit at start); 0 when it cannot be read or is unlimited
// (RLIM_INFINITY, all ones).
func openFileLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == ^uint64(0) {
		return 0
	}
	return rl.Cur
}
