module github.com/caddy-tollgate/tollgate/bench/peers

go 1.25.0

replace github.com/caddy-tollgate/tollgate => ../..

require (
	github.com/caddy-tollgate/tollgate v0.0.0-00010101000000-000000000000
	github.com/sethvargo/go-limiter v0.7.1
	github.com/throttled/throttled/v2 v2.15.0
	github.com/ulule/limiter/v3 v3.11.2
	golang.org/x/time v0.14.0
)

require (
	github.com/hashicorp/golang-lru v0.5.4 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/stretchr/testify v1.11.1 // indirect
)
