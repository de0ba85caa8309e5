package tollgate

import (
	"strings"
	"testing"
)

// TestRedisURLErrorsHideThePassword: a URL that does not parse, in any of
// the ways net/url and go-redis reject one, gives an error that names the
// field and the URL, password hidden, and holds no part of the password;
// also when the URL comes from an environment variable.
func TestRedisURLErrorsHideThePassword(t *testing.T) {
	const pw = "s3cr3t-Pw"
	for _, c := range []struct{ name, url, want string }{
		{"bad port", "redis://u:" + pw + "@h:x/0", "invalid port"},
		{"bad scheme", "http://u:" + pw + "@h:6379", "invalid URL scheme"},
		{"bad db", "redis://u:" + pw + "@h:6379/abc", "invalid database number"},
		{"bad escape in the password", "redis://u:" + pw + "%zz@h:6379", "invalid URL escape"},
		{"escape is the password", "redis://u:%zz@h:6379", "invalid URL escape"},
		{"space in host", "redis://u:" + pw + "@h :6379", "invalid character"},
		{"open bracket", "redis://:" + pw + "@[::1:6379", "missing ']'"},
		{"unknown option", "redis://u:" + pw + "@h:6379/0?foo=bar", "unexpected option"},
		{"bad option value", "redis://u:" + pw + "@h:6379/0?dial_timeout=abc", "invalid dial_timeout"},
		{"control character", "redis://u:" + pw + "\x01@h", "invalid control character"},
		{"at sign in the password", "redis://u:" + pw + "@x@h:x", "invalid port"},
	} {
		for _, fromEnv := range []bool{false, true} {
			name := c.name
			r := &RedisStorage{URL: c.url}
			if fromEnv {
				name += "/env"
				t.Setenv("TOLLGATE_TEST_REDIS_URL", c.url)
				r.URL = "{env.TOLLGATE_TEST_REDIS_URL}"
			}
			_, err := r.options()
			if err == nil {
				t.Errorf("%s: options() = nil error, want one", name)
				continue
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "url ") || !strings.Contains(msg, c.want) {
				t.Errorf("%s: error %q, want it to start with the field (url) and say %q", name, msg, c.want)
			}
			secret := pw
			if strings.Contains(c.url, ":%zz@") {
				secret = "%zz"
			}
			if strings.Contains(msg, secret) || strings.Contains(msg, "Pw") {
				t.Errorf("%s: error %q reveals the password", name, msg)
			}
			if !strings.Contains(msg, "xxxxx") {
				t.Errorf("%s: error %q does not show where the password was hidden", name, msg)
			}
		}
	}
}
