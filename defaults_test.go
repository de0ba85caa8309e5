package tollgate

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// TestIPv6PrefixDefaultsTo64: without ipv6_prefix, the addresses of one
// /64 are one client: a host cannot mint identities from its prefix.
func TestIPv6PrefixDefaultsTo64(t *testing.T) {
	tester := caddytest.NewTester(t)
	tester.InitServer(globalOptions+`
	localhost:9080 {
		rate_limit {
			zone v6 {
				key {http.request.header.X-Client}
				rate 2/h
			}
		}
		respond "ok"
	}`, "caddyfile")
	for _, c := range []struct {
		addr   string
		status int
	}{
		{"2001:db8:0:1::1", 200},
		{"2001:db8:0:1:ffff:ffff:ffff:ffff", 200},
		{"2001:db8:0:1:1234::99", 429}, // the same /64: its third request
		{"2001:db8:0:2::1", 200},       // another /64
		{"203.0.113.7", 200},
		{"203.0.113.8", 200}, // IPv4 stays whole by default
	} {
		resp, _ := get(t, tester, "/", "X-Client: "+c.addr)
		check(t, c.addr, resp, "", want{status: c.status})
	}
}

// TestFixedCostAboveCapacityIsAConfigError: a fixed cost or default_cost
// that no request could ever be admitted with fails the config load,
// naming the field, the value and the capacity.
func TestFixedCostAboveCapacityIsAConfigError(t *testing.T) {
	site := func(zone string) string {
		return ":8080 {\n\trate_limit {\n\t\tzone z {\n\t\t\t" + zone + "\n\t\t}\n\t}\n}\n"
	}
	for _, c := range []struct{ name, zone, want string }{
		{"cost above burst", "rate 10/s\n\t\t\tburst 5\n\t\t\tcost 6", "cost: 6 is above the zone's capacity of 5 events (burst)"},
		{"cost above events", "algorithm fixed_window\n\t\t\trate 10/m\n\t\t\tcost 10.5", "cost: 10.5 is above the zone's capacity of 10 events (events)"},
		{"default_cost above capacity", "rate 10/s\n\t\t\tcost {http.request.header.W}\n\t\t\tdefault_cost 11", "default_cost: 11 is above the zone's capacity of 10 events (burst)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := validate(site(c.zone))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("validate = %v, want an error containing %q", err, c.want)
			}
		})
	}
	for _, ok := range []string{"rate 10/s\n\t\t\tcost 10", "rate 10/s\n\t\t\tcost {http.request.header.W}\n\t\t\tdefault_cost 10"} {
		if err := validate(site(ok)); err != nil {
			t.Errorf("validate(%q) = %v, want nil: a cost at the capacity is admissible", ok, err)
		}
	}
}
