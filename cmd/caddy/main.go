// Command caddy is Caddy with its standard modules and Tollgate, for
// running the examples and tests with nothing but the Go toolchain:
//
//	go run ./cmd/caddy run --config examples/Caddyfile
//
// Production builds use xcaddy (see the README).
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddy-tollgate/tollgate"
)

func main() {
	caddycmd.Main()
}
