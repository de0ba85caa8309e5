package tollgate

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/caddy-tollgate/tollgate/storage"
)

// TestValidateRejectsBadInput runs each bad Caddyfile through the adapter
// and caddy.Validate, as `caddy validate` does, and checks the error names
// the field and the value.
func TestValidateRejectsBadInput(t *testing.T) {
	site := func(body string) string {
		return ":8080 {\n\trate_limit {\n" + body + "\n\t}\n\trespond ok\n}\n"
	}
	zone := func(body string) string { return site("zone z {\n" + body + "\n}") }
	cases := []struct {
		name, config, want string
	}{
		{"events 0", zone("events 0\nwindow 1m"), "events: must be greater than 0, got 0"},
		{"events not a number", zone("events ten\nwindow 1m"), "events: want a whole number, got 'ten'"},
		{"window 0", zone("events 5\nwindow 0s"), "window: must be greater than 0, got 0s"},
		{"window junk", zone("events 5\nwindow soon"), "window: want a duration such as 1m, got 'soon'"},
		{"burst negative", zone("rate 5/s\nburst -1"), "burst: must not be negative, got -1"},
		{"unknown algorithm", zone("rate 5/s\nalgorithm bogus"), `unknown algorithm "bogus"`},
		{"rate unparsable", zone("rate fast"), `rate: "fast": want <events>/<window>`},
		{"rate bad unit", zone("rate 10/fortnight"), `unknown window "fortnight"`},
		{"rate zero", zone("rate 0/s"), `events must be a whole number > 0, got "0"`},
		{"rate and events", zone("rate 10/s\nevents 5"), "rate is shorthand for events and window"},
		{"missing window", zone("events 5"), "requires both events and window"},
		{"zone option twice", zone("rate 5/s\nkey a\nkey b"), "option 'key' given twice"},
		{"unknown zone option", zone("rate 5/s\nflavour vanilla"), "unrecognized subdirective 'flavour'"},
		{"unknown option", site("zone z {\nrate 5/s\n}\nflavour vanilla"), "unrecognized subdirective 'flavour'"},
		{"option twice", site("zone z {\nrate 5/s\n}\njitter 0.1\njitter 0.2"), "option 'jitter' given twice"},
		{"zone twice", site("zone z {\nrate 5/s\n}\nzone z {\nrate 5/s\n}"), "zone 'z' defined twice"},
		{"jitter above 1", site("zone z {\nrate 5/s\n}\njitter 1.5"), "jitter: must be in [0, 1], got 1.5"},
		{"jitter negative", site("zone z {\nrate 5/s\n}\njitter -0.1"), "jitter: must be in [0, 1], got -0.1"},
		{"status not an error", site("zone z {\nrate 5/s\n}\nstatus 200"), "status: must be an HTTP error status (400-599), got 200"},
		{"headers unknown", site("zone z {\nrate 5/s\n}\nheaders fancy"), `headers: unknown mode "fancy"`},
		{"headers none with others", site("zone z {\nrate 5/s\n}\nheaders none ietf"), "headers: none cannot be combined"},
		{"max_keys negative", site("zone z {\nrate 5/s\n}\nmax_keys -5"), "max_keys: must not be negative, got -5"},
		{"ipv4_prefix too long", zone("rate 5/s\nipv4_prefix 33"), "ipv4_prefix: must be in [0, 32], got 33"},
		{"ipv6_prefix too long", zone("rate 5/s\nipv6_prefix 129"), "ipv6_prefix: must be in [0, 128], got 129"},
		{"cost junk", zone("rate 5/s\ncost lots"), `cost: must be a finite number >= 0, a placeholder template or an expression, got "lots"`},
		{"cost negative", zone("rate 5/s\ncost -1"), `cost: must be a finite number >= 0, a placeholder template or an expression, got "-1"`},
		{"default_cost NaN", zone("rate 5/s\ndefault_cost NaN"), "default_cost: want a finite number, got 'NaN'"},
		{"default_cost negative", zone("rate 5/s\ndefault_cost -2"), "default_cost: must be a finite number >= 0, got -2"},
		{"max_delay on token bucket", zone("rate 5/s\nmax_delay 1s"), "max_delay: only leaky_bucket can delay requests"},
		{"on_storage_error unknown", zone("rate 5/s\non_storage_error panic"), `on_storage_error: must be allow, deny or local, got "panic"`},
		{"lease unknown", zone("rate 5/s\nlease 1s"), `lease: must be on or off, got "1s"`},
		{"lease without value", zone("rate 5/s\nlease"), `wrong argument count`},
		{"rate too fine", zone("algorithm token_bucket\nevents 2000000\nwindow 1s"), "more than one per microsecond"},
		{"zone name", site("zone bad/name {\nrate 5/s\n}"), `zone name "bad/name"`},
		{"distributed", site("zone z {\nrate 5/s\n}\ndistributed"), "use the redis storage"},
		{"storage unknown", site("zone z {\nrate 5/s\n}\nstorage floppy"), "floppy"},
		{"no zones", site("jitter 0.1"), "at least one zone is required"},
		// mholt v0.1.0 ignored both, limiting every request.
		{"match outside a zone", site("match {\npath /api/*\n}\nzone z {\nrate 5/s\n}"), "unrecognized subdirective 'match'"},
		{"unknown zone option", zone("rate 5/s\nevent 10"), "zone 'z': unrecognized subdirective 'event'"},
		{"sliding_log too many events", zone("algorithm sliding_log\nevents 200000\nwindow 1h"), "events: sliding_log keeps one timestamp per event and allows at most 100000, got 200000"},
		{"burst on a window algorithm", zone("algorithm fixed_window\nrate 5/s\nburst 10"), "burst: fixed_window has no bucket"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := validate(c.config)
			if err == nil {
				t.Fatalf("validate = nil, want an error containing %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("validate = %q, want it to contain %q", err, c.want)
			}
		})
	}
}

func TestValidateAcceptsExamples(t *testing.T) {
	for _, cfg := range []string{
		":8080 {\n\trate_limit {\n\t\tzone z {\n\t\t\trate 5/s\n\t\t}\n\t}\n}\n",
		":8080 {\n\trate_limit {\n\t\tzone z {\n\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\talgorithm sliding_log\n\t\t}\n\t\theaders ietf ietf-draft-03 x-ratelimit\n\t}\n}\n",
	} {
		if err := validate(cfg); err != nil {
			t.Errorf("validate(%q) = %v, want nil", cfg, err)
		}
	}
}

func TestParseRate(t *testing.T) {
	cases := []struct {
		in     string
		events int64
		window time.Duration
	}{
		{"10/s", 10, time.Second},
		{"600/m", 600, time.Minute},
		{"5000/h", 5000, time.Hour},
		{"100/10s", 100, 10 * time.Second},
		{"3/d", 3, 24 * time.Hour},
		{"50/ms", 50, time.Millisecond},
		{"7/1m30s", 7, 90 * time.Second},
	}
	for _, c := range cases {
		events, window, err := ParseRate(c.in)
		if err != nil || events != c.events || window != c.window {
			t.Errorf("ParseRate(%q) = %d, %s, %v; want %d, %s, nil", c.in, events, window, err, c.events, c.window)
		}
	}
	for _, bad := range []string{"", "10", "/s", "10/", "-1/s", "0/s", "1.5/s", "10/0s", "10/-1s", "10/y", "x/s", "10/s/s"} {
		if _, _, err := ParseRate(bad); err == nil {
			t.Errorf("ParseRate(%q) = nil error, want one", bad)
		}
	}
}

func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"10/s", "100/10s", "1/d", "5/1h30m", "0/s", "/", "9999999999999999999/s", "1/999999h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		events, window, err := ParseRate(s)
		if err == nil && (events <= 0 || window <= 0) {
			t.Fatalf("ParseRate(%q) = %d, %s, nil: accepted a non-positive rate", s, events, window)
		}
	})
}

// FuzzUnmarshalCaddyfile runs the rate_limit directive in a site through
// Caddy's Caddyfile adapter, as `caddy adapt` does: input that does not
// tokenize or parse is an error there, never a panic (Caddy's test
// dispenser, which the fuzzer used to build its input with, exits the
// process at the first lexer error, so the fuzzer never got past `<<<`).
// What adapts is then validated as `caddy validate` would.
func FuzzUnmarshalCaddyfile(f *testing.F) {
	for _, s := range []string{
		"zone z {\n rate 10/s\n}",
		"zone z {\n key {client_ip}\n events 5\n window 1m\n burst 10\n algorithm gcra\n cost {http.request.header.W}\n default_cost 2\n}\njitter 0.3",
		"zone z {\n match {\n path /a\n }\n rate 1/s\n dry_run\n on_storage_error local\n ipv4_prefix 24\n}\nheaders ietf x-ratelimit\nstatus 503\nmax_keys 10\nsweep_interval 1s\nlog_key",
		"zone {\n}", "zone z z", "storage", "headers", "zone z {\n rate\n}", "}}}{{{",
		"<<<", "zone z {\n key <<EOF\nx\nEOF\n rate 1/s\n}", "zone z {\n key `{a}\n rate 1/s\n}", "zone z {\n rate 1/s\n}\nstorage redis {\n url redis://u:p@h:x\n}",
		"zone z {\n algorithm sliding_log\n rate 100000/h\n}\nmax_keys 1", "zone z {\n rate 1000000/s\n burst 1099511627776\n}",
		"zone z {\n rate 5/m\n ban 15m\n ban_after 3\n concurrency 2\n concurrency_lease 5s\n}",
		"zone z {\n concurrency 1\n}", "zone z {\n concurrency adaptive\n}", "zone z {\n rate 5/s\n concurrency adaptive {\n  min 2\n  max 9\n  window 10ms\n  percentile 0.5\n  status 429\n }\n}", "zone z {\n rate 2/m\n tier {header.P} {\n  gold 5/m burst 6\n  free 1/m\n  staff unlimited\n }\n}",
		"zone z {\n rate 2/m\n tier {header.P} {\n }\n}",
		"zone z {\n algorithm fixed_window\n rate 1000/mo\n align calendar\n timezone Europe/Berlin\n tier {header.P} {\n  pro 50000/3mo\n  day 10/2d\n }\n}",
		"zone z {\n algorithm fixed_window\n events 3\n window 2w\n align calendar\n}", "zone z {\n rate 2/m\n tier {header.P} {\n  \"\" 1/s\n  x 0/s burst\n }\n}",
	} {
		f.Add(s)
	}
	adapter := caddyconfig.GetAdapter("caddyfile")
	f.Fuzz(func(t *testing.T, body string) {
		site := ":8080 {\n\trate_limit {\n" + body + "\n\t}\n}\n"
		cfg, _, err := adapter.Adapt([]byte(site), nil)
		if err != nil {
			return
		}
		_ = validateJSON(cfg)
	})
}

// validateJSON runs caddy validate's checks on a JSON config: it loads and
// provisions every module, and starts nothing.
func validateJSON(cfg []byte) error {
	var c caddy.Config
	if err := json.Unmarshal(cfg, &c); err != nil {
		return err
	}
	return caddy.Validate(&c)
}

// FuzzJSONConfig provisions any rate_limit handler JSON in a route, as
// `caddy validate` does with a JSON config: bad values are errors, never a
// panic.
func FuzzJSONConfig(f *testing.F) {
	for _, s := range []string{
		`{"rate_limits": {"z": {"events": 10, "window": "1s"}}}`,
		`{"rate_limits": {"z": {"events": 10, "window": 1000000000, "burst": 50, "algorithm": "gcra", "cost": 2}}, "jitter": 0.5}`,
		`{"rate_limits": {"z": {"events": 10, "window": "1m", "key": "{http.request.header.K}", "cost": "{http.request.header.W}", "default_cost": 0.5, "algorithm": "sliding_window"}}, "zone_order": ["z"], "headers": ["ietf", "x-ratelimit"]}`,
		`{"rate_limits": {"z": {"events": 5, "window": "1s", "algorithm": "leaky_bucket", "max_delay": "2s"}}, "max_keys": 3}`,
		`{"rate_limits": {"z": {"events": 1, "window": "1s", "ipv6_prefix": 200}}}`,
		`{"rate_limits": {"z": null}}`, `{"rate_limits": {"": {}}}`, `{"status": 99}`, `{}`,
		`{"rate_limits": {"z": {"events": 1099511627776, "window": 1125899906842624000}}}`,
		`{"rate_limits": {"z": {"events": 1, "window": "1s"}}, "storage": {"module": "redis", "url": "redis://u:secret@h:x"}}`,
		`{"rate_limits": {"z": {"events": 5, "window": "1m", "ban": "15m", "ban_after": 3, "concurrency": 2, "concurrency_lease": "5s"}}}`,
		`{"rate_limits": {"z": {"concurrency": 1}}}`, `{"rate_limits": {"z": {"concurrency_adaptive": {}}}}`,
		`{"rate_limits": {"z": {"concurrency_adaptive": {"min": 1, "max": 1, "initial": 1, "window": 1, "min_samples": 1, "percentile": 0.01, "tolerance": 1, "smoothing": 1, "epoch": 4, "max_keys": 1, "status": 599}}}}`,
		`{"rate_limits": {"z": {"algorithm": "fixed_window", "events": 100, "window": "1mo", "align": "calendar", "timezone": "Asia/Kolkata", "tier_key": "{http.request.header.P}", "tiers": {"pro": {"events": 5000, "window": "2w"}}}}}`, `{"rate_limits": {"z": {"concurrency": -1, "ban": "-1s"}}}`,
		`{"rate_limits": {"z": {"events": 2, "window": "1m", "tier_key": "{http.request.header.P}", "tiers": {"gold": {"events": 5, "window": "1m", "burst": 6}, "staff": {"unlimited": true}, "x": null}}}}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, handler string) {
		if !json.Valid([]byte(handler)) || !strings.HasPrefix(strings.TrimSpace(handler), "{") {
			return
		}
		h := strings.TrimSpace(handler)
		cfg := `{"apps": {"http": {"servers": {"s": {"listen": [":8080"], "routes": [{"handle": [{"handler": "rate_limit", ` + h[1:] + `]}]}}}}}`
		_ = validateJSON([]byte(cfg))
	})
}

// FuzzKeys: a resolved key, masked to its zone's prefixes and bounded, is
// never longer than a hash, and a key that is bounded already is kept.
func FuzzKeys(f *testing.F) {
	for _, s := range []string{"203.0.113.7", "2001:db8::1", "::ffff:1.2.3.4", "fe80::1%eth0", "#abc", "", strings.Repeat("k", 200), "a:b:c", "1.2.3.4/24"} {
		f.Add(s, 24, 64)
	}
	f.Fuzz(func(t *testing.T, key string, v4, v6 int) {
		z := &zone{v4bits: v4 & 31, v6bits: v6 & 127}
		got := z.storedKey(key)
		if len(got) > storage.MaxKeyLen && !strings.HasPrefix(got, "#") {
			t.Fatalf("storedKey(%q) = %q: longer than %d and not hashed", key, got, storage.MaxKeyLen)
		}
		if len(got) > storage.MaxKeyLen+45 {
			t.Fatalf("storedKey(%q) = %q: too long", key, got)
		}
		if again := storage.BoundKey(got); again != got && !strings.HasPrefix(got, "#") {
			t.Fatalf("BoundKey(%q) = %q: a bounded key changed", got, again)
		}
		if key != got && !strings.HasPrefix(got, "#") && !strings.Contains(key, ":") && !strings.Contains(key, ".") {
			t.Fatalf("storedKey(%q) = %q: a key that is no IP changed", key, got)
		}
	})
}

// FuzzRedisURL: a Redis URL that does not parse gives an error without its
// password, whatever else the URL holds.
func FuzzRedisURL(f *testing.F) {
	for _, s := range []string{"redis://u:%s@h:x/0", "redis://:%s@[::1:6379", "http://u:%s@h", "redis://u:%s@h:6379/abc", "rediss://u:%s@h:6379/0?foo=bar", "u:%s@h"} {
		f.Add(s, "Sup3rSecret")
	}
	f.Fuzz(func(t *testing.T, shape, password string) {
		if len(password) < 6 || strings.ContainsAny(password, "@/?#%:[]") || strings.Count(shape, "%s") != 1 {
			return
		}
		for _, r := range password {
			if r < '!' || r > '~' {
				return
			}
		}
		u := strings.Replace(shape, "%s", password, 1)
		if !strings.Contains(u, ":"+password+"@") || strings.Count(u, password) != 1 ||
			strings.Contains(strconv.Quote(strings.Replace(u, password, "", 1)), password) {
			return // the password is not in the user info, or the rest of the URL spells it too
		}
		_, err := (&RedisStorage{URL: u}).options()
		if err != nil && strings.Contains(err.Error(), password) {
			t.Fatalf("options(%q): error %q holds the password", u, err)
		}
	})
}
