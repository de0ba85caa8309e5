package tollgate

import (
	"fmt"
	"net"
	"os"
	"testing"
)

// TestMain refuses to run when something already listens on caddytest's
// admin port: caddytest would then send every test config to that other
// Caddy (another test run, or a developer's server) instead of starting
// its own, and the tests would check someone else's state.
func TestMain(m *testing.M) {
	if path := os.Getenv(childEnv); path != "" {
		runChildCaddy(path) // a Caddy instance for a test to kill
	}
	ln, err := net.Listen("tcp", "localhost:2999")
	if err != nil {
		fmt.Fprintf(os.Stderr, "tollgate tests: localhost:2999 (caddytest's admin port) is in use: %v\n"+
			"another Caddy or test run is listening there; stop it and run the tests again\n", err)
		os.Exit(1)
	}
	ln.Close()
	os.Exit(m.Run())
}
