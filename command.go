package tollgate

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/caddy-tollgate/tollgate/internal/adminapi"
)

// cliSubcommand is one subcommand of `caddy rate-limit`. A new one is a
// row of cliSubcommands: its usage, help and example are listed by `help`
// and the command's long help from there.
type cliSubcommand struct {
	name    string
	args    []string // the positional arguments, e.g. <zone> <key>
	short   string   // one line of help
	example string   // one example command line
	// run runs it; nil for help, which lists this table.
	run func(c *cliRun, args []string) error
}

// cliSubcommands are the subcommands of `caddy rate-limit`, in the order
// help lists them.
var cliSubcommands = []cliSubcommand{
	{"zones", nil, "list the live zones: algorithm, limit, storage, keys",
		"caddy rate-limit zones", (*cliRun).zones},
	{"show", []string{"<zone>", "<key>"}, "show one key's state: remaining, reset, grant, ban, tier (--tier for one tier's)",
		"caddy rate-limit show api 'customer/42 eu'", (*cliRun).show},
	{"reset", []string{"<zone>", "<key>"}, "reset a key: its next request finds a fresh state (--tier: that tier only)",
		"caddy rate-limit reset api customer-42", (*cliRun).reset},
	{"unban", []string{"<zone>", "<key>"}, "lift a key's ban and forget its strikes, leaving its rate",
		"caddy rate-limit unban login 203.0.113.9", (*cliRun).unban},
	{"grant", []string{"<zone>", "<key>", "<amount>"}, "give a key <amount> events more for its current window (the window algorithms; --tier: in that tier)",
		"caddy rate-limit grant monthly key-acme-7f3a 5000", (*cliRun).grant},
	{"help", nil, "list these subcommands",
		"caddy rate-limit help", nil}, // run: help (which lists this table)
}

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "rate-limit",
		Usage: "[--address <admin>] [--json] [--tier <value>] <subcommand> [<zone> <key>]",
		Short: "Shows rate-limit zones and keys, resets keys and lifts bans through the admin API",
		Long:  cliHelp(),
		CobraFunc: func(cmd *cobra.Command) {
			cmd.PersistentFlags().String("address", "", "The address of Caddy's admin API, if not the default")
			cmd.PersistentFlags().String("tier", "", "In a zone with tiers, the tier whose state to show or reset (reset: every tier without it)")
			cmd.PersistentFlags().Bool("json", false, "Print the admin API's JSON answer, for scripts")
			// Without a subcommand, the help; with a word that is none, an
			// error naming it (cobra would print the help and exit 0).
			cmd.Args = cobra.ArbitraryArgs
			cmd.RunE = func(cmd *cobra.Command, args []string) error {
				if len(args) == 0 {
					return cmd.Help()
				}
				return fmt.Errorf("unknown subcommand %q (want one of %s; see caddy rate-limit help)", args[0], subcommandNames())
			}
			for _, sub := range cliSubcommands {
				cmd.AddCommand(&cobra.Command{
					Use:     strings.Join(append([]string{sub.name}, sub.args...), " "),
					Short:   sub.short,
					Example: "  " + sub.example,
					Args:    cobra.ExactArgs(len(sub.args)),
					RunE: func(cmd *cobra.Command, args []string) error {
						c, err := newCLIRun(cmd)
						if err != nil {
							return err
						}
						if sub.run == nil {
							return c.help()
						}
						return sub.run(c, args)
					},
				})
			}
		},
	})
}

// subcommandNames lists the subcommands, for errors: "zones, show, ...".
func subcommandNames() string {
	names := make([]string, len(cliSubcommands))
	for i, sub := range cliSubcommands {
		names[i] = sub.name
	}
	return strings.Join(names, ", ")
}

// cliHelp lists the subcommands with an example each, for `help` and the
// command's long help.
func cliHelp() string {
	var b strings.Builder
	b.WriteString(`
Talks to the rate-limit admin API (admin.api.rate_limit) of a running Caddy
and prints what it answers as aligned tables; --json prints the API's JSON
instead, for scripts.

Subcommands:
`)
	tw := tabwriter.NewWriter(&b, 0, 0, 3, ' ', 0)
	for _, sub := range cliSubcommands {
		fmt.Fprintf(tw, "  %s\t%s\n", strings.Join(append([]string{sub.name}, sub.args...), " "), sub.short)
		fmt.Fprintf(tw, "  \t  e.g. %s\n", sub.example)
	}
	tw.Flush()
	b.WriteString(`
<key> is the resolved key as the zone's key template produces it (an IP
address, an API key, a user name), given as it is: the command escapes it
for the URL, '/', spaces, '%' and IPv6 addresses included. An IP address
is grouped by the zone's ipv4_prefix/ipv6_prefix and a long key hashed,
as the handler does.

--address is the admin endpoint, by default Caddy's (localhost:2019, or
the CADDY_ADMIN environment variable). An unknown zone or key, or a store
that cannot answer, exits with status 1 and says what to do.
`)
	return b.String()
}

// cliRun is one run of a subcommand: where it prints, and its flags.
type cliRun struct {
	out     io.Writer
	address string // the admin endpoint, resolved
	tier    string
	json    bool
}

func newCLIRun(cmd *cobra.Command) (*cliRun, error) {
	c := &cliRun{out: cmd.OutOrStdout()}
	address, err := cmd.Flags().GetString("address")
	if err != nil {
		return nil, err
	}
	if c.tier, err = cmd.Flags().GetString("tier"); err != nil {
		return nil, err
	}
	if c.json, err = cmd.Flags().GetBool("json"); err != nil {
		return nil, err
	}
	if c.address, err = caddycmd.DetermineAdminAPIAddress(address, nil, "", ""); err != nil {
		return nil, fmt.Errorf("determining the admin API address: %w", err)
	}
	return c, nil
}

// apiError is an answer of the admin API other than 2xx.
type apiError struct {
	status int
	msg    string // the API's error message, or its body
}

func (e *apiError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.status, e.msg) }

// caddyErrorAnswer is how caddycmd.AdminAPIRequest reports an answer of
// 400 or more.
var caddyErrorAnswer = regexp.MustCompile(`(?s)HTTP (\d{3}): (.*)$`)

// request sends one request to the admin API, with a JSON body if body is
// not nil, and returns the answer's body. An admin API that cannot be
// reached, and an answer other than 2xx (an *apiError), are errors that
// say what to do.
func (c *cliRun) request(method, uri string, body io.Reader) ([]byte, error) {
	resp, err := caddycmd.AdminAPIRequest(c.address, method, uri, nil, body)
	if err != nil {
		m := caddyErrorAnswer.FindStringSubmatch(err.Error())
		if m == nil {
			return nil, fmt.Errorf("cannot reach Caddy's admin API at %s (%v): is Caddy running, with its admin endpoint on? "+
				"Give its address with --address (the admin global option), or set CADDY_ADMIN", c.address, err)
		}
		status, _ := strconv.Atoi(m[1])
		msg := strings.TrimSpace(m[2])
		var body struct {
			Error string `json:"error"`
		}
		if json.Unmarshal([]byte(msg), &body) == nil && body.Error != "" {
			msg = body.Error
		}
		return nil, &apiError{status, msg}
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the answer of %s %s: %w", method, uri, err)
	}
	return answer, nil
}

// noEndpoint is the error for an admin API without Tollgate's endpoint.
func (c *cliRun) noEndpoint(err error) error {
	return fmt.Errorf("the admin API at %s has no rate-limit endpoint (%v): is that Caddy built with Tollgate "+
		"(caddy list-modules | grep rate_limit), and is %s its admin address? Give another with --address", c.address, err, c.address)
}

// listZones gets the live zones.
func (c *cliRun) listZones() ([]byte, []adminapi.ZoneInfo, error) {
	body, err := c.request(http.MethodGet, adminapi.Prefix+"zones", nil)
	var ae *apiError
	if errors.As(err, &ae) && ae.status == http.StatusNotFound {
		return nil, nil, c.noEndpoint(err)
	}
	if err != nil {
		return nil, nil, err
	}
	var zones []adminapi.ZoneInfo
	if err := json.Unmarshal(body, &zones); err != nil {
		return nil, nil, c.noEndpoint(fmt.Errorf("its answer is not a list of zones: %v", err))
	}
	return body, zones, nil
}

// keyRequest sends a request about a key (path "keys" or "bans"; an
// action on the key, such as "/grant", after it, with a JSON body) and
// returns the answer, or an error that says what to do.
func (c *cliRun) keyRequest(method, path, zone, key, action string, body io.Reader) ([]byte, error) {
	uri := adminapi.KeyURI(zone, path, key) + action
	if c.tier != "" {
		uri += "?tier=" + url.QueryEscape(c.tier)
	}
	answer, err := c.request(method, uri, body)
	var ae *apiError
	if !errors.As(err, &ae) {
		return answer, err
	}
	switch {
	case ae.status == http.StatusNotFound && strings.HasPrefix(ae.msg, "unknown zone"):
		_, zones, lerr := c.listZones()
		if lerr != nil {
			return nil, c.noEndpoint(err)
		}
		names := make([]string, len(zones))
		for i, z := range zones {
			names[i] = z.Zone
		}
		return nil, fmt.Errorf("%s; the zones of the running config are: %s (caddy rate-limit zones lists them)",
			ae.msg, strings.Join(names, ", "))
	case ae.status == http.StatusNotFound && strings.Contains(ae.msg, "holds no"):
		return nil, fmt.Errorf("%s: the zone has decided nothing on that key since its state was last fresh, "+
			"so there is nothing to show or reset (give the key as the zone's key template resolves it)", ae.msg)
	case ae.status == http.StatusNotFound && strings.Contains(ae.msg, "has no tier"):
		return nil, fmt.Errorf("%s: --tier takes one of the values the zone's tier block lists (caddy rate-limit zones shows them)", ae.msg)
	case ae.status == http.StatusNotFound && strings.Contains(ae.msg, "has no ban"):
		return nil, fmt.Errorf("%s: unban is for zones with ban; use reset to reset the key", ae.msg)
	case ae.status == http.StatusNotFound: // not an answer of Tollgate's API
		return nil, c.noEndpoint(err)
	case ae.status == http.StatusServiceUnavailable:
		return nil, unavailableError{fmt.Errorf("%s: the zone's store cannot answer now (is Redis up?); try again", ae.msg)}
	}
	return nil, err
}

func (c *cliRun) zones(args []string) error {
	body, zones, err := c.listZones()
	if err != nil {
		return err
	}
	if c.json {
		_, err := c.out.Write(body)
		return err
	}
	return adminapi.WriteZones(c.out, zones)
}

func (c *cliRun) show(args []string) error {
	body, err := c.keyRequest(http.MethodGet, "keys", args[0], args[1], "", nil)
	if err != nil {
		return err
	}
	if c.json {
		_, err := c.out.Write(body)
		return err
	}
	var st adminapi.KeyState
	if err := json.Unmarshal(body, &st); err != nil {
		return c.noEndpoint(fmt.Errorf("its answer is not a key's state: %v", err))
	}
	return adminapi.WriteKey(c.out, st)
}

func (c *cliRun) reset(args []string) error {
	body, err := c.keyRequest(http.MethodDelete, "keys", args[0], args[1], "", nil)
	if err != nil {
		return err
	}
	return c.done(body, "reset", "")
}

func (c *cliRun) unban(args []string) error {
	body, err := c.keyRequest(http.MethodDelete, "bans", args[0], args[1], "", nil)
	if err != nil {
		return err
	}
	return c.done(body, "lifted the ban of", " (its rate's state stays)")
}

func (c *cliRun) grant(args []string) error {
	amount, err := strconv.ParseFloat(args[2], 64)
	if err != nil || !(amount > 0) || math.IsInf(amount, 0) {
		return fmt.Errorf("grant: amount must be a number of events > 0, got %q", args[2])
	}
	// One id for this grant and its retries: the API applies it once,
	// however often it arrives.
	id := newGrantID()
	req := `{"amount": ` + strconv.FormatFloat(amount, 'g', -1, 64) + `, "id": "` + id + `"}`
	var body []byte
	for try := 1; ; try++ {
		body, err = c.keyRequest(http.MethodPost, "keys", args[0], args[1], "/grant", strings.NewReader(req))
		if !errors.As(err, new(unavailableError)) || try == grantTries {
			break
		}
		time.Sleep(grantRetryWait)
	}
	if err != nil {
		return err
	}
	if c.json {
		_, err := c.out.Write(body)
		return err
	}
	var ans struct {
		Zone, Key string
		Granted   float64
		State     adminapi.KeyState
	}
	if err := json.Unmarshal(body, &ans); err != nil {
		return c.noEndpoint(fmt.Errorf("its answer is not JSON: %v", err))
	}
	where := "zone " + ans.Zone
	if c.tier != "" {
		where += ", tier " + c.tier
	}
	_, err = fmt.Fprintf(c.out, "granted key %q in %s %s more events for its current window: %d remaining, the window resets in %s\n",
		ans.Key, where, strconv.FormatFloat(ans.Granted, 'g', -1, 64), ans.State.Remaining, adminapi.FormatSeconds(ans.State.Reset))
	return err
}

// grantTries is how many times grant sends a grant the store did not
// confirm, grantRetryWait apart (a breaker retries Redis every 250ms).
const (
	grantTries     = 3
	grantRetryWait = time.Second
)

// newGrantID returns a grant id that no other grant has: "cli-" and 16
// random hex digits.
func newGrantID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "cli-" + hex.EncodeToString(b[:])
}

// unavailableError is an answer of 503: the store could not answer now.
type unavailableError struct{ error }

func (e unavailableError) Unwrap() error { return e.error }

// done prints the answer of a reset or unban.
func (c *cliRun) done(body []byte, what, tail string) error {
	if c.json {
		_, err := c.out.Write(body)
		return err
	}
	var ans struct{ Zone, Key string }
	if err := json.Unmarshal(body, &ans); err != nil {
		return c.noEndpoint(fmt.Errorf("its answer is not JSON: %v", err))
	}
	where := "zone " + ans.Zone
	if c.tier != "" {
		where += ", tier " + c.tier
	}
	_, err := fmt.Fprintf(c.out, "%s key %q in %s%s\n", what, ans.Key, where, tail)
	return err
}

func (c *cliRun) help() error {
	_, err := io.WriteString(c.out, strings.TrimPrefix(cliHelp(), "\n"))
	return err
}
