//go:build unix

package redistest

import (
	"os"
	"syscall"
)

// sigStop and sigCont pause and resume a server.
var sigStop, sigCont os.Signal = syscall.SIGSTOP, syscall.SIGCONT
