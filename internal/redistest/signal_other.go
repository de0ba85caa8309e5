//go:build !unix

package redistest

import "os"

// sigStop and sigCont are nil where Pause and Resume are not supported.
var sigStop, sigCont os.Signal
