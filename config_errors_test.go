package tollgate

import (
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestBadValuesFailAtAdapt: every bad value fails `caddy adapt` itself,
// with the file and line of the field and its value, and the same value in
// a JSON config fails at provision with the same message. The line marked
// "# <-" is where the error must point; without one, the rate_limit line.
func TestBadValuesFailAtAdapt(t *testing.T) {
	cases := []struct {
		name      string
		caddyfile string // the rate_limit block's body
		json      string // the handler's fields, in a route; "" for a Caddyfile-only case
		want      string
	}{
		{"events 0", "zone z {\n\tevents 0 # <-\n\twindow 1m\n}",
			`"rate_limits": {"z": {"events": 0, "window": "1m"}}`, "events: must be greater than 0, got 0"},
		{"max_events 0", "",
			`"rate_limits": {"z": {"max_events": 0, "window": "1m"}}`, "events: must be greater than 0, got 0"},
		{"max_events negative", "",
			`"rate_limits": {"z": {"max_events": -1, "window": "1m"}}`, "max_events: must be greater than 0, got -1"},
		{"events and max_events", "",
			`"rate_limits": {"z": {"events": 5, "max_events": 5, "window": "1m"}}`, "events and max_events: give one or the other"},
		{"window 0", "zone z {\n\tevents 5\n\twindow 0s # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": 0}}`, "window: must be greater than 0, got 0s"},
		{"rate too fine", "zone z {\n\trate 2000000/s # <-\n}",
			`"rate_limits": {"z": {"algorithm": "token_bucket", "events": 2000000, "window": "1s"}}`, "events: 2000000 per 1s is more than one per microsecond"},
		{"jitter 2", "zone z {\n\trate 5/s\n}\njitter 2 # <-",
			`"rate_limits": {"z": {"events": 5, "window": "1s"}}, "jitter": 2`, "jitter: must be in [0, 1], got 2"},
		{"cost abc", "zone z {\n\trate 5/s\n\tcost abc # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "cost": "abc"}}`, `cost: must be a finite number >= 0, a placeholder template or an expression, got "abc"`},
		{"cost expression unfinished", "zone z {\n\trate 5/s\n\tcost \"{header.W} *\" # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "cost": "{http.request.header.W} *"}}`, `cost: expression "{http.request.header.W} *" at position 26: want a number, a placeholder, max(, min( or '(', got the end`},
		{"cost negative", "zone z {\n\trate 5/s\n\tcost -1 # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "cost": -1}}`, `cost: must be a finite number >= 0, a placeholder template or an expression, got "-1"`},
		{"cost constant expression malformed", "zone z {\n\trate 5/s\n\tcost \"1000 *\" # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "cost": "1000 *"}}`, `cost: must be a finite number >= 0, a placeholder template or an expression, got "1000 *"`},
		{"cost constant expression negative", "zone z {\n\trate 5/s\n\tcost \"1 - 2\" # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "cost": "1 - 2"}}`, `cost: "1 - 2" is not a finite number >= 0`},
		{"cost_response expression unclosed", "zone z {\n\trate 5/m\n\tcost_response \"({http.rate_limit.response.json.usage.input_tokens} + 2\" # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1m", "cost_response": "({http.rate_limit.response.json.usage.input_tokens} + 2"}}`, `cost_response: expression "({http.rate_limit.response.json.usage.input_tokens} + 2" at position 56: want ')', got the end`},
		{"cost_response expression operator", "zone z {\n\trate 5/m\n\tcost_response \"{http.response.size} ^ 2\" # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1m", "cost_response": "{http.response.size} ^ 2"}}`, `cost_response: expression "{http.response.size} ^ 2" at position 22: want an operator (+ - * /) or the end, got "^"`},
		{"cost_response expression bad default", "zone z {\n\trate 5/m\n\tcost_response \"{http.response.size:many}\" # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1m", "cost_response": "{http.response.size:many}"}}`, `cost_response: expression "{http.response.size:many}" at position 1: the default of {http.response.size} must be a number >= 0, got "many"`},
		{"cost_response expression unquoted", "zone z {\n\trate 5/m\n\tcost_response {http.response.size} * 2 # <-\n}",
			"", `wrong argument count`},
		{"cost above capacity", "zone z {\n\trate 5/s\n\tcost 6 # <-\n}",
			`"rate_limits": {"z": {"algorithm": "token_bucket", "events": 5, "window": "1s", "cost": 6}}`, "cost: 6 is above the zone's capacity of 5 events (burst)"},
		{"default_cost negative", "zone z {\n\trate 5/s\n\tcost {http.request.header.W}\n\tdefault_cost -2 # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "cost": "{http.request.header.W}", "default_cost": -2}}`, "default_cost: must be a finite number >= 0, got -2"},
		{"burst negative", "zone z {\n\trate 5/s\n\tburst -1 # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "burst": -1}}`, "burst: must not be negative, got -1"},
		{"burst on a window algorithm", "zone z {\n\talgorithm fixed_window\n\trate 5/s\n\tburst 10 # <-\n}",
			`"rate_limits": {"z": {"algorithm": "fixed_window", "events": 5, "window": "1s", "burst": 10}}`, "burst: fixed_window has no bucket"},
		{"algorithm unknown", "zone z {\n\trate 5/s\n\talgorithm bogus # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "algorithm": "bogus"}}`, `algorithm: unknown algorithm "bogus"`},
		{"max_delay on a token bucket", "zone z {\n\trate 5/s\n\tmax_delay 1s # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "max_delay": "1s"}}`, "max_delay: only leaky_bucket can delay requests"},
		{"ipv4_prefix 33", "zone z {\n\trate 5/s\n\tipv4_prefix 33 # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "ipv4_prefix": 33}}`, "ipv4_prefix: must be in [0, 32], got 33"},
		{"ipv6_prefix 129", "zone z {\n\trate 5/s\n\tipv6_prefix 129 # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "ipv6_prefix": 129}}`, "ipv6_prefix: must be in [0, 128], got 129"},
		{"lease unknown", "zone z {\n\trate 5/s\n\tlease sometimes # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "lease": "sometimes"}}`, `lease: must be on or off, got "sometimes"`},
		{"on_storage_error unknown", "zone z {\n\trate 5/s\n\ton_storage_error panic # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "on_storage_error": "panic"}}`, `on_storage_error: must be allow, deny or local, got "panic"`},
		{"sliding_log too long", "zone z {\n\talgorithm sliding_log\n\tevents 200000 # <-\n\twindow 1h\n}",
			`"rate_limits": {"z": {"algorithm": "sliding_log", "events": 200000, "window": "1h"}}`, "events: sliding_log keeps one timestamp per event"},
		{"status 200", "zone z {\n\trate 5/s\n}\nstatus 200 # <-",
			`"rate_limits": {"z": {"events": 5, "window": "1s"}}, "status": 200`, "status: must be an HTTP error status (400-599), got 200"},
		{"headers unknown", "zone z {\n\trate 5/s\n}\nheaders fancy # <-",
			`"rate_limits": {"z": {"events": 5, "window": "1s"}}, "headers": ["fancy"]`, `headers: unknown mode "fancy"`},
		{"max_keys negative", "zone z {\n\trate 5/s\n}\nmax_keys -5 # <-",
			`"rate_limits": {"z": {"events": 5, "window": "1s"}}, "max_keys": -5`, "max_keys: must not be negative, got -5"},
		{"sweep_interval negative", "zone z {\n\trate 5/s\n}\nsweep_interval -1s # <-",
			`"rate_limits": {"z": {"events": 5, "window": "1s"}}, "sweep_interval": "-1s"`, "sweep_interval: must not be negative, got -1s"},
		{"no zone", "log_key",
			`"log_key": true`, "rate_limits: at least one zone is required"},
		{"distributed", "zone z {\n\trate 5/s\n}\ndistributed # <-",
			`"rate_limits": {"z": {"events": 5, "window": "1s"}}, "distributed": {}`, errDistributed.Error()},
		{"distributed with options", "distributed { # <-\n\tread_interval 5s\n}\nzone z {\n\trate 5/s\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s"}}, "distributed": {"read_interval": "5s"}`, errDistributed.Error()},
		{"storage a Caddy storage module", "zone z {\n\trate 5/s\n}\nstorage file_system { # <-\n\troot /tmp\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s"}}, "storage": {"module": "file_system", "root": "/tmp"}`, `storage: "file_system" is a Caddy storage module`},
		{"storage unknown", "zone z {\n\trate 5/s\n}\nstorage floppy # <-",
			`"rate_limits": {"z": {"events": 5, "window": "1s"}}, "storage": {"module": "floppy"}`, `storage: unknown rate_limit storage "floppy": want memory (the default) or redis`},
		{"redis functions neither on nor off", "zone z {\n\trate 5/s\n}\nstorage redis {\n\tfunctions eval # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s"}}, "storage": {"module": "redis", "functions": "eval"}`, `functions: must be on or off, got`},
		{"concurrency 0", "zone z {\n\tconcurrency 0 # <-\n}",
			`"rate_limits": {"z": {"concurrency": -1}}`, "concurrency: must be greater than 0, got "},
		{"concurrency negative", "zone z {\n\trate 5/s\n\tconcurrency -2 # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "concurrency": -2}}`, "concurrency: must be greater than 0, got -2"},
		{"concurrency_lease too short", "zone z {\n\tconcurrency 2\n\tconcurrency_lease 10ms # <-\n}",
			`"rate_limits": {"z": {"concurrency": 2, "concurrency_lease": "10ms"}}`, "concurrency_lease: must be at least 1s, got 10ms"},
		{"concurrency_lease alone", "zone z {\n\trate 5/s\n\tconcurrency_lease 10s # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "concurrency_lease": "10s"}}`, "concurrency_lease: only with concurrency, got concurrency_lease 10s"},
		{"adaptive min 0", "zone z {\n\tconcurrency adaptive {\n\t\tmin 0 # <-\n\t}\n}",
			`"rate_limits": {"z": {"concurrency_adaptive": {"min": -1}}}`, "concurrency adaptive: min: must be greater than 0, got "},
		{"adaptive max below min", "zone z {\n\tconcurrency adaptive { # <-\n\t\tmin 10\n\t\tmax 5\n\t}\n}",
			`"rate_limits": {"z": {"concurrency_adaptive": {"min": 10, "max": 5}}}`, "concurrency adaptive: max: must be in [min (10), 1099511627776], got 5"},
		{"adaptive initial above max", "zone z {\n\tconcurrency adaptive { # <-\n\t\tmax 10\n\t\tinitial 50\n\t}\n}",
			`"rate_limits": {"z": {"concurrency_adaptive": {"max": 10, "initial": 50}}}`, "concurrency adaptive: initial: must be in [min (1), max (10)], got 50"},
		{"adaptive percentile 1", "zone z {\n\trate 5/s\n\tconcurrency adaptive { # <-\n\t\tpercentile 1\n\t}\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "concurrency_adaptive": {"percentile": 1}}}`, "concurrency adaptive: percentile: must be in (0, 1), got 1"},
		{"adaptive tolerance below 1", "zone z {\n\tconcurrency adaptive { # <-\n\t\ttolerance 0.5\n\t}\n}",
			`"rate_limits": {"z": {"concurrency_adaptive": {"tolerance": 0.5}}}`, "concurrency adaptive: tolerance: must be in [1, 100], got 0.5"},
		{"adaptive epoch 2", "zone z {\n\tconcurrency adaptive { # <-\n\t\tepoch 2\n\t}\n}",
			`"rate_limits": {"z": {"concurrency_adaptive": {"epoch": 2}}}`, "concurrency adaptive: epoch: must be in [4, 1048576] windows, got 2"},
		{"adaptive status 200", "zone z {\n\tconcurrency adaptive { # <-\n\t\tstatus 200\n\t}\n}",
			`"rate_limits": {"z": {"concurrency_adaptive": {"status": 200}}}`, "concurrency adaptive: status: must be a 4xx or 5xx code, got 200"},
		{"adaptive window 0", "zone z {\n\tconcurrency adaptive {\n\t\twindow 0s # <-\n\t}\n}",
			"", "concurrency adaptive: window: must be greater than 0, got 0s"},
		{"adaptive window negative", "",
			`"rate_limits": {"z": {"concurrency_adaptive": {"window": "-1s"}}}`, "concurrency adaptive: window: must be at least 1µs, got -1s"},
		{"adaptive unknown setting", "zone z {\n\tconcurrency adaptive {\n\t\tfloor 3 # <-\n\t}\n}",
			"", "concurrency adaptive: unrecognized setting 'floor'"},
		{"adaptive argument", "zone z {\n\tconcurrency adaptive 5 # <-\n}",
			"", "concurrency adaptive: unexpected argument '5' (settings go in a block)"},
		{"adaptive and a number", "",
			`"rate_limits": {"z": {"concurrency": 5, "concurrency_adaptive": {}}}`, "concurrency: give a number or adaptive, not both; got concurrency 5 and concurrency adaptive"},
		{"adaptive with a lease", "zone z {\n\tconcurrency adaptive\n\tconcurrency_lease 10s # <-\n}",
			`"rate_limits": {"z": {"concurrency_adaptive": {}, "concurrency_lease": "10s"}}`, "concurrency_lease: a lease is a Redis slot's, and concurrency adaptive keeps its state in each instance's memory; got concurrency_lease 10s"},
		{"adaptive alone with a burst", "zone z {\n\tconcurrency adaptive\n\tburst 5 # <-\n}",
			`"rate_limits": {"z": {"concurrency_adaptive": {}, "burst": 5}}`, "burst: belongs to a rate, and the zone has only concurrency"},
		{"burst without a rate", "zone z {\n\tconcurrency 2\n\tburst 5 # <-\n}",
			`"rate_limits": {"z": {"concurrency": 2, "burst": 5}}`, "burst: belongs to a rate, and the zone has only concurrency"},
		{"ban without a rate", "zone z {\n\tconcurrency 2\n\tban 1m # <-\n}",
			`"rate_limits": {"z": {"concurrency": 2, "ban": "1m"}}`, "ban: a ban counts the zone's rejections within its window, so it needs a rate"},
		{"ban negative", "zone z {\n\trate 5/s\n\tban -1m # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "ban": "-1m"}}`, "ban: must be greater than 0, got -1m0s"},
		{"ban_after alone", "zone z {\n\trate 5/s\n\tban_after 3 # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "ban_after": 3}}`, "ban_after: only with ban, got ban_after 3"},
		{"ban_after negative", "zone z {\n\trate 5/s\n\tban 1m\n\tban_after -3 # <-\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1s", "ban": "1m", "ban_after": -3}}`, "ban_after: must be greater than 0, got -3"},
		{"tier without a rate", "zone z {\n\tconcurrency 2\n\ttier {header.P} { # <-\n\t\tgold 5/m\n\t}\n}",
			`"rate_limits": {"z": {"concurrency": 2, "tier_key": "{http.request.header.P}", "tiers": {"gold": {"events": 5, "window": "1m"}}}}`, "tiers: a tier changes the zone's rate, and the zone has only concurrency"},
		{"tier rate 0", "zone z {\n\trate 5/m\n\ttier {header.P} {\n\t\tgold 0/m # <-\n\t}\n}",
			"", `tiers "gold": rate: "0/m": events must be a whole number > 0`},
		{"tier burst negative", "zone z {\n\trate 5/m\n\ttier {header.P} {\n\t\tfree 1/m\n\t\tgold 5/m burst -1 # <-\n\t}\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1m", "tier_key": "{http.request.header.P}", "tiers": {"free": {"events": 1, "window": "1m"}, "gold": {"events": 5, "window": "1m", "burst": -1}}}}`, `tiers "gold": burst: must not be negative, got -1`},
		{"tier unknown word", "zone z {\n\trate 5/m\n\ttier {header.P} {\n\t\tgold 5/m fast # <-\n\t}\n}",
			"", `tiers "gold": want <rate> [burst <n>] or unlimited, got "5/m fast"`},
		{"tier given twice", "zone z {\n\trate 5/m\n\ttier {header.P} {\n\t\tgold 5/m\n\t\tgold 6/m # <-\n\t}\n}",
			"", "tier value 'gold' given twice"},
		{"tier cost above capacity", "zone z {\n\trate 5/m\n\tcost 3\n\ttier {header.P} {\n\t\tfree 2/m # <-\n\t}\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1m", "cost": 3, "tier_key": "{http.request.header.P}", "tiers": {"free": {"events": 2, "window": "1m"}}}}`, `tiers "free": cost: 3 is above the tier's capacity of 2 events`},
		{"tier default_cost above capacity", "zone z {\n\trate 5/m\n\tcost {header.W}\n\tdefault_cost 3\n\ttier {header.P} {\n\t\tfree 2/m # <-\n\t}\n}",
			`"rate_limits": {"z": {"events": 5, "window": "1m", "cost": "{http.request.header.W}", "default_cost": 3, "tier_key": "{http.request.header.P}", "tiers": {"free": {"events": 2, "window": "1m"}}}}`, `tiers "free": default_cost: 3 is above the tier's capacity of 2 events`},
		{"tier_key without tiers", "",
			`"rate_limits": {"z": {"events": 5, "window": "1m", "tier_key": "{http.request.header.P}"}}`, `tier_key: needs tiers, the limit of each value; got tier_key "{http.request.header.P}" alone`},
		{"tiers without tier_key", "",
			`"rate_limits": {"z": {"events": 5, "window": "1m", "tiers": {"gold": {"events": 5, "window": "1m"}}}}`, "tiers: need tier_key"},
		{"timezone unknown", "zone z {\n\talgorithm fixed_window\n\trate 100/d\n\talign calendar\n\ttimezone Mars/Olympus_Mons # <-\n}",
			`"rate_limits": {"z": {"algorithm": "fixed_window", "events": 100, "window": "1d", "align": "calendar", "timezone": "Mars/Olympus_Mons"}}`, `timezone: unknown time zone "Mars/Olympus_Mons"`},
		{"timezone Local", "zone z {\n\talgorithm fixed_window\n\trate 100/d\n\talign calendar\n\ttimezone Local # <-\n}",
			`"rate_limits": {"z": {"algorithm": "fixed_window", "events": 100, "window": "1d", "align": "calendar", "timezone": "Local"}}`, `timezone: Local is each machine's own zone`},
		{"timezone without align", "zone z {\n\talgorithm fixed_window\n\trate 100/d\n\ttimezone Europe/Berlin # <-\n}",
			`"rate_limits": {"z": {"algorithm": "fixed_window", "events": 100, "window": "1d", "timezone": "Europe/Berlin"}}`, `timezone: only a calendar window (align calendar) has a time zone`},
		{"months without align", "zone z {\n\talgorithm fixed_window\n\tevents 100\n\twindow 1mo # <-\n}",
			`"rate_limits": {"z": {"algorithm": "fixed_window", "events": 100, "window": "1mo"}}`, `window: 1mo has no fixed length: a window of months needs align calendar`},
		{"rate per month without align", "zone z {\n\talgorithm fixed_window\n\trate 1000/mo # <-\n}",
			"", `window: 1mo has no fixed length`},
		{"sliding_log by default, too many events", "zone z {\n\tevents 200000 # <-\n\twindow 1h\n}",
			`"rate_limits": {"z": {"events": 200000, "window": "1h"}}`, "events: a zone with events and window and no algorithm is a sliding_log (at most events in any window, exactly), which keeps a time per event and allows at most 100000, got 200000; set algorithm sliding_window"},
		{"align on token_bucket", "zone z {\n\trate 100/d\n\talign calendar # <-\n}",
			`"rate_limits": {"z": {"algorithm": "token_bucket", "events": 100, "window": "1d", "align": "calendar"}}`, `align: only fixed_window aligns its windows to the calendar, not token_bucket`},
		{"align on sliding_window", "zone z {\n\talgorithm sliding_window\n\trate 100/d\n\talign calendar # <-\n}",
			`"rate_limits": {"z": {"algorithm": "sliding_window", "events": 100, "window": "1d", "align": "calendar"}}`, `align: only fixed_window aligns its windows to the calendar, not sliding_window`},
		{"align unknown", "zone z {\n\talgorithm fixed_window\n\trate 100/d\n\talign midnight # <-\n}",
			`"rate_limits": {"z": {"algorithm": "fixed_window", "events": 100, "window": "1d", "align": "midnight"}}`, `align: must be calendar, got "midnight"`},
		{"align calendar on hours", "zone z {\n\talgorithm fixed_window\n\tevents 100\n\twindow 36h # <-\n\talign calendar\n}",
			`"rate_limits": {"z": {"algorithm": "fixed_window", "events": 100, "window": "36h", "align": "calendar"}}`, `window: align calendar needs whole days, weeks or months (1d, 1w, 1mo and multiples), got 36h0m0s`},
		{"window months bad", "zone z {\n\talgorithm fixed_window\n\tevents 100\n\twindow 0mo # <-\n\talign calendar\n}",
			`"rate_limits": {"z": {"algorithm": "fixed_window", "events": 100, "window": "-1mo", "align": "calendar"}}`, `window: want a whole number of months > 0 such as 1mo`},
		{"calendar with a ban", "zone z {\n\talgorithm fixed_window\n\trate 100/d\n\talign calendar\n\tban 1h # <-\n}",
			`"rate_limits": {"z": {"algorithm": "fixed_window", "events": 100, "window": "1d", "align": "calendar", "ban": "1h"}}`, `ban: a ban counts rejections within a window of fixed length`},
		{"calendar tier on hours", "zone z {\n\talgorithm fixed_window\n\trate 100/d\n\talign calendar\n\ttier {header.P} {\n\t\tgold 500/h # <-\n\t}\n}",
			`"rate_limits": {"z": {"algorithm": "fixed_window", "events": 100, "window": "1d", "align": "calendar", "tier_key": "{http.request.header.P}", "tiers": {"gold": {"events": 500, "window": "1h"}}}}`, `tiers "gold": window: align calendar needs whole days, weeks or months`},
		{"tier per month without align", "zone z {\n\talgorithm fixed_window\n\trate 100/d\n\ttier {header.P} {\n\t\tgold 500/mo # <-\n\t}\n}",
			`"rate_limits": {"z": {"algorithm": "fixed_window", "events": 100, "window": "1d", "tier_key": "{http.request.header.P}", "tiers": {"gold": {"events": 500, "window": "1mo"}}}}`, `tiers "gold": window: 1mo has no fixed length`},
		{"unlimited with events", "",
			`"rate_limits": {"z": {"events": 5, "window": "1m", "tier_key": "{http.request.header.P}", "tiers": {"gold": {"events": 5, "unlimited": true}}}}`, `tiers "gold": unlimited: takes no events, window or burst`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.caddyfile != "" {
				site := ":8080 {\n\trate_limit {\n" + c.caddyfile + "\n\t}\n\trespond ok\n}\n"
				line := 2
				for i, l := range strings.Split(site, "\n") {
					if strings.HasSuffix(l, "# <-") {
						line = i + 1
					}
				}
				_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(site), map[string]any{"filename": "Caddyfile"})
				at := fmt.Sprintf(", at Caddyfile:%d", line)
				if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasSuffix(err.Error(), at) {
					t.Errorf("adapt = %v, want an error containing %q and ending %q", err, c.want, at)
				}
			}
			if c.json == "" {
				return
			}
			cfg := `{"apps": {"http": {"servers": {"s": {"listen": [":8080"], "routes": [{"handle": [{"handler": "rate_limit", ` + c.json + `}]}]}}}}}`
			if err := validateJSON([]byte(cfg)); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("JSON: provision = %v, want an error containing %q", err, c.want)
			}
		})
	}
}
