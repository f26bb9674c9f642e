package suite

import "syscall"

// noFileHardLimit is this process's hard RLIMIT_NOFILE, which children
// inherit and cannot exceed.
func noFileHardLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	return rl.Max
}
