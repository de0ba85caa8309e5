package tollgate

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// testAdminPort is caddytest's admin port: 2999, or
// TOLLGATE_TEST_ADMIN_PORT, so that a long run of one test
// (TOLLGATE_INTERACT) can go on beside the rest of the suite. Only the
// admin endpoint moves: tests that share their sites' ports cannot run
// side by side.
var testAdminPort = func() int {
	if p, err := strconv.Atoi(os.Getenv("TOLLGATE_TEST_ADMIN_PORT")); err == nil && p > 0 {
		return p
	}
	return 2999
}()

// testAdmin is the admin endpoint's address.
var testAdmin = "localhost:" + strconv.Itoa(testAdminPort)

// TestMain refuses to run when something already listens on caddytest's
// admin port: caddytest would then send every test config to that other
// Caddy (another test run, or a developer's server) instead of starting
// its own, and the tests would check someone else's state.
func TestMain(m *testing.M) {
	if path := os.Getenv(childEnv); path != "" {
		runChildCaddy(path) // a Caddy instance for a test to kill
	}
	if args := os.Getenv(cliChildEnv); args != "" {
		runChildCLI(args) // Caddy's command line, for its exit status
	}
	caddytest.Default.AdminPort = testAdminPort
	ln, err := net.Listen("tcp", testAdmin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "tollgate tests: %s (caddytest's admin port) is in use: %v\n"+
			"another Caddy or test run is listening there; stop it and run the tests again\n"+
			"(or give the run another admin port with TOLLGATE_TEST_ADMIN_PORT)\n", testAdmin, err)
		os.Exit(1)
	}
	ln.Close()
	os.Exit(m.Run())
}
