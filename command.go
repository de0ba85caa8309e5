package tollgate

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "rate-limit",
		Usage: "[--address <admin>] zones | show <zone> <key> | reset <zone> <key> | unban <zone> <key> | grant <zone> <key> <amount>",
		Short: "Lists rate-limit zones, shows or resets a key through the admin API",
		Long: `
Talks to the rate-limit admin API (admin.api.rate_limit) of a running Caddy
and prints what it answers, as JSON.

  zones               the live zones and their key counts
  show <zone> <key>   one key's state: allowed, remaining, reset, wait
                      (--tier <value>: its state in that tier)
  reset <zone> <key>  reset the key: its next request finds a fresh state
  unban <zone> <key>  lift the key's ban (in a zone with ban), leaving its rate
  grant <zone> <key> <amount>
                      give the key <amount> events more for its current
                      window (fixed_window, sliding_window); the grant ends
                      with the window (--tier <value>: in that tier)

<key> is the resolved key as the zone's key template produces it (an IP
address, an API key, a user name), given as it is: the command escapes it
for the URL, '/', spaces, '%' and IPv6 addresses included. An IP address
is grouped by the zone's ipv4_prefix/ipv6_prefix and a long key hashed,
as the handler does.

--address is the admin endpoint, by default Caddy's (localhost:2019, or
the CADDY_ADMIN environment variable). An unknown zone or key, or a store
that cannot answer, is an error, with the API's answer.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.PersistentFlags().String("address", "", "The address of Caddy's admin API, if not the default")
			cmd.PersistentFlags().String("tier", "", "In a zone with tiers, the tier whose state to show, reset or grant to (reset: every tier without it)")
			for _, sub := range []struct {
				use, short string
				method     string
				args       int
				path       string // the key's endpoint: keys or bans
			}{
				{"zones", "Lists the live zones and their key counts", http.MethodGet, 0, ""},
				{"show <zone> <key>", "Shows one key's state", http.MethodGet, 2, "keys"},
				{"reset <zone> <key>", "Resets one key", http.MethodDelete, 2, "keys"},
				{"unban <zone> <key>", "Lifts one key's ban", http.MethodDelete, 2, "bans"},
				{"grant <zone> <key> <amount>", "Gives one key extra quota for its current window", http.MethodPost, 3, "keys"},
			} {
				cmd.AddCommand(&cobra.Command{
					Use:   sub.use,
					Short: sub.short,
					Args:  cobra.ExactArgs(sub.args),
					RunE: func(cmd *cobra.Command, args []string) error {
						address, err := cmd.Flags().GetString("address")
						if err != nil {
							return err
						}
						tier, err := cmd.Flags().GetString("tier")
						if err != nil {
							return err
						}
						return rateLimitRequest(cmd.OutOrStdout(), address, sub.method, sub.path, tier, args)
					},
				})
			}
		},
	})
}

// rateLimitRequest sends one request of `caddy rate-limit` to the admin
// API at address (Caddy's default when empty) and copies the answer to w:
// GET /rate_limit/zones without args, the key's endpoint with a zone and
// a key. An answer other than 2xx is an error that quotes it.
func rateLimitRequest(w io.Writer, address, method, path, tier string, args []string) error {
	address, err := caddycmd.DetermineAdminAPIAddress(address, nil, "", "")
	if err != nil {
		return fmt.Errorf("determining the admin API address: %w", err)
	}
	uri := adminPrefix + "zones"
	var body io.Reader
	if len(args) >= 2 {
		uri = keyURI(args[0], path, args[1])
		if len(args) == 3 { // grant <zone> <key> <amount>
			amount, err := strconv.ParseFloat(args[2], 64)
			if err != nil || !(amount > 0) || math.IsInf(amount, 0) {
				return fmt.Errorf("grant: amount must be a number of events > 0, got %q", args[2])
			}
			uri += "/grant"
			body = strings.NewReader(`{"amount": ` + strconv.FormatFloat(amount, 'g', -1, 64) + `}`)
		}
		if tier != "" {
			uri += "?tier=" + url.QueryEscape(tier)
		}
	}
	var hdr http.Header
	if body != nil {
		hdr = http.Header{"Content-Type": {"application/json"}}
	}
	resp, err := caddycmd.AdminAPIRequest(address, method, uri, hdr, body)
	if err != nil {
		return fmt.Errorf("%s %s at %s: %w", method, uri, address, err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("reading the answer of %s %s: %w", method, uri, err)
	}
	return nil
}

// keyURI is the admin API path of a key in a zone (path "keys"), or of its
// ban ("bans"), zone and key each one path segment.
func keyURI(zone, path, key string) string {
	return adminPrefix + "zones/" + pathSegment(zone) + "/" + path + "/" + pathSegment(key)
}

// pathSegment escapes s as one path segment: url.PathEscape escapes '/',
// '%', '?', '#' and spaces, and keeps the ':' of an IPv6 address, which a
// segment may hold. A segment "." or ".." is escaped too, or the admin
// endpoint's mux would clean it away as a step in the path.
func pathSegment(s string) string {
	if s == "." || s == ".." {
		return strings.Repeat("%2E", len(s))
	}
	return url.PathEscape(s)
}
