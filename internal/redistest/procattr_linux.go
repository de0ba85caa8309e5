package redistest

import "syscall"

// sysProcAttr has the kernel kill a server whose test binary dies without
// running its cleanups (a panic, a test timeout), so that no server
// outlives its test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
