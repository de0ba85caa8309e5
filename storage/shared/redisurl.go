package shared

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// ParseURL parses a redis:// or rediss:// URL. Its error names the
// URL with the password hidden, and never holds the password: the errors
// of net/url quote the whole URL, and may quote a piece of it.
func ParseURL(u string) (*goredis.Options, error) {
	o, err := goredis.ParseURL(u)
	if err == nil {
		return o, nil
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // without the URL it quotes
	}
	msg := err.Error()
	if strings.Contains(u, "@") {
		// A URL with user info that does not parse may hold its password
		// anywhere the parsers echo it: keep only what the message says
		// of the kind of fault, before any quoted or appended input.
		msg = faultKind(msg)
	}
	return nil, fmt.Errorf("url %q: %s", redactURL(u), msg)
}

// faultKind is the part of a URL parser's message that names the fault,
// without the input it quotes or appends: `invalid port ":x" after host`
// is "invalid port", `redis: unexpected option: foo` "unexpected option".
func faultKind(msg string) string {
	for _, prefix := range []string{"redis: ", "net/url: "} {
		msg = strings.TrimPrefix(msg, prefix)
	}
	if i := strings.IndexByte(msg, '"'); i >= 0 {
		msg = msg[:i]
	}
	if i := strings.Index(msg, ": "); i >= 0 {
		msg = msg[:i]
	}
	return strings.TrimSpace(msg)
}

// userInfo returns where a URL's user info starts and ends (at its last
// '@', or -1 without one): after the scheme's "://" when the URL starts
// with a scheme (letters, digits, '+', '-', '.') and "://" comes before
// the '@', else at the start.
func userInfo(u string) (start, at int) {
	at = strings.LastIndexByte(u, '@')
	if i := strings.Index(u, "://"); i > 0 && i < at && isScheme(u[:i]) {
		start = i + 3
	}
	return start, at
}

// isScheme reports whether s can be a URL scheme.
func isScheme(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && (c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return false
		}
	}
	return s != ""
}

// redactURL hides a URL's password for error messages: as net/url does
// for a URL with plain user info, else the whole user info (in a URL that
// does not parse, what looks like the name may be a piece of the
// password).
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil && strings.Count(s, "@") == 1 {
		return u.Redacted() // user:xxxxx@, the name kept
	}
	start, at := userInfo(s)
	if at < 0 {
		return s
	}
	return s[:start] + "xxxxx" + s[at:]
}

// PoolKey identifies a client by every setting that makes it
// different, hashed so that the password is not kept in the clear.
func PoolKey(o *goredis.UniversalOptions, prefix string, pipeline, functions bool) string {
	h := sha256.New()
	fmt.Fprintf(h, "%q|%q|%q|%d|%q|%d|%v|%q|%d|%v|%v", o.Addrs, o.Username, o.Password, o.DB, o.MasterName, o.PoolSize, o.TLSConfig != nil && o.TLSConfig.InsecureSkipVerify, prefix, o.ReadTimeout, pipeline, functions)
	if o.TLSConfig != nil {
		h.Write([]byte("|tls"))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// KeysOf identifies the Redis keys a client with options o and key
// prefix reaches: its servers (or Sentinel master), database and prefix,
// hashed as PoolKey is. Clients whose pool size, timeouts,
// pipelining or credentials differ reach the same keys.
func KeysOf(o *goredis.UniversalOptions, prefix string) string {
	addrs := slices.Clone(o.Addrs)
	slices.Sort(addrs)
	h := sha256.Sum256(fmt.Appendf(nil, "%q|%d|%q|%q", addrs, o.DB, o.MasterName, prefix))
	return hex.EncodeToString(h[:])
}
