//go:build !linux && !darwin

package gateway

// openFileLimit is unknown (0) on systems whose RLIMIT_NOFILE is not read here.
func openFileLimit() uint64 { return 0 }
