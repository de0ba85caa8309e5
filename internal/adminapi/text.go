package adminapi

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
)

// table is an aligned table written to out on Flush, without the
// spaces tabwriter leaves after a row's last cell.
type table struct {
	*tabwriter.Writer
	buf bytes.Buffer
	out io.Writer
}

func newTable(out io.Writer) *table {
	t := &table{out: out}
	t.Writer = tabwriter.NewWriter(&t.buf, 0, 0, 2, ' ', 0)
	return t
}

func (t *table) Flush() error {
	if err := t.Writer.Flush(); err != nil {
		return err
	}
	var b strings.Builder
	for _, line := range strings.SplitAfter(t.buf.String(), "\n") {
		b.WriteString(strings.TrimRight(line, " \n"))
		if strings.HasSuffix(line, "\n") {
			b.WriteByte('\n')
		}
	}
	_, err := io.WriteString(t.out, b.String())
	return err
}

// WriteZones writes the zones as a table: one row per zone.
func WriteZones(out io.Writer, zones []ZoneInfo) error {
	tw := newTable(out)
	fmt.Fprintln(tw, "ZONE\tALGORITHM\tLIMIT\tBURST\tSTORAGE\tKEYS\tALSO")
	for _, z := range zones {
		alg, limit, burst := z.Algorithm, "-", "-"
		if z.Events > 0 {
			limit, burst = limitText(z.Events, z.Window, z.Calendar), strconv.FormatInt(z.Burst, 10)
		} else {
			alg = "-"
		}
		keys := "-" // a store that keeps no count (Redis)
		if z.Keys != nil {
			keys = strconv.Itoa(*z.Keys)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", z.Zone, alg, limit, burst, z.Storage, keys, zoneAlso(z))
	}
	return tw.Flush()
}

// zoneAlso describes what a zone has beside its rate.
func zoneAlso(z ZoneInfo) string {
	var also []string
	if z.Calendar != "" {
		also = append(also, "calendar "+z.Timezone)
	}
	if z.Concurrency > 0 {
		s := fmt.Sprintf("concurrency %d", z.Concurrency)
		if z.Storage == "redis" {
			s += " (lease " + FormatSeconds(z.ConcurrencyLease) + ")"
		}
		also = append(also, s)
	}
	if a := z.Adaptive; a != nil {
		also = append(also, fmt.Sprintf("concurrency adaptive %d-%d: limit %d, %d in flight, %d shed", a.Min, a.Max, a.Limit, a.InFlight, a.Shed))
	}
	if z.Ban > 0 {
		also = append(also, fmt.Sprintf("ban %s after %d", FormatSeconds(z.Ban), z.BanAfter))
	}
	if z.TierKey != "" {
		values := make([]string, 0, len(z.Tiers))
		for v := range z.Tiers {
			values = append(values, v)
		}
		sort.Strings(values)
		tiers := make([]string, len(values))
		for i, v := range values {
			t := z.Tiers[v]
			switch {
			case t.Unlimited:
				tiers[i] = v + " unlimited"
			case t.Burst != t.Events:
				tiers[i] = fmt.Sprintf("%s %s burst %d", v, limitText(t.Events, t.Window, t.Calendar), t.Burst)
			default:
				tiers[i] = v + " " + limitText(t.Events, t.Window, t.Calendar)
			}
		}
		also = append(also, "tiers by "+z.TierKey+": "+strings.Join(tiers, ", "))
	}
	if z.DryRun {
		also = append(also, "dry run")
	}
	return strings.Join(also, "; ")
}

// WriteKey writes a key's state as a table: one row per field.
func WriteKey(out io.Writer, st KeyState) error {
	tw := newTable(out)
	fmt.Fprintf(tw, "zone\t%s\n", st.Zone)
	fmt.Fprintf(tw, "key\t%s\n", st.Key)
	if st.Tier != "" {
		fmt.Fprintf(tw, "tier\t%s\n", st.Tier)
	}
	allowed := "yes"
	if !st.Allowed {
		allowed = "no, next in " + FormatSeconds(st.Wait)
	}
	fmt.Fprintf(tw, "allowed\t%s\n", allowed)
	fmt.Fprintf(tw, "remaining\t%d\n", st.Remaining)
	reset := "now (the quota is whole)"
	if st.Reset > 0 {
		reset = "in " + FormatSeconds(st.Reset)
	}
	fmt.Fprintf(tw, "reset\t%s\n", reset)
	if st.Granted > 0 {
		fmt.Fprintf(tw, "granted\t%s more events for the current window\n", strconv.FormatFloat(st.Granted, 'g', -1, 64))
	}
	if l := st.Lease; l != nil {
		fmt.Fprintf(tw, "lease\t%s events held by this instance for %s (not in remaining)\n", strconv.FormatFloat(l.Events, 'g', -1, 64), FormatSeconds(l.Left))
	}
	if b := st.Ban; b != nil {
		ban := fmt.Sprintf("no (%d strikes left)", b.StrikesLeft)
		if b.Banned {
			ban = "banned for " + FormatSeconds(b.Left)
		}
		fmt.Fprintf(tw, "ban\t%s\n", ban)
	}
	if st.InFlight != nil {
		fmt.Fprintf(tw, "in flight\t%d\n", *st.InFlight)
	}
	if a := st.Adaptive; a != nil {
		fmt.Fprintf(tw, "adaptive limit\t%d (%d in flight)\n", a.Limit, a.InFlight)
		if a.Windows > 0 {
			fmt.Fprintf(tw, "round trips\tbaseline %s, recent %s, gradient %.2f\n", FormatSeconds(a.Baseline), FormatSeconds(a.Recent), a.Gradient)
		} else {
			fmt.Fprintf(tw, "round trips\tnone learnt yet\n")
		}
	}
	return tw.Flush()
}

// FormatLimit writes events per window (seconds) as "100/min", "5/h",
// "20/s", or "100/10s" for a window that is not one unit.
func FormatLimit(events int64, window float64) string {
	for _, u := range []struct {
		seconds float64
		name    string
	}{{1, "s"}, {60, "min"}, {3600, "h"}, {86400, "day"}, {7 * 86400, "week"}} {
		if window == u.seconds {
			return fmt.Sprintf("%d/%s", events, u.name)
		}
	}
	return fmt.Sprintf("%d/%s", events, FormatSeconds(window))
}

// limitText is a rate for the zones table: FormatLimit, or for a
// calendar window (calendar "1mo", "3mo", "1d", "2w") the window as
// `rate` and `window` spell it, "100000/mo", "100/3mo", "2/d": a month
// has no length in seconds, and its nominal 30 days is not what the
// zone counts.
func limitText(events int64, window float64, calendar string) string {
	if calendar == "" {
		return FormatLimit(events, window)
	}
	if unit, ok := strings.CutPrefix(calendar, "1"); ok && unit != "" && (unit[0] < '0' || unit[0] > '9') {
		calendar = unit // one unit: "mo", as in rate 100000/mo
	}
	return fmt.Sprintf("%d/%s", events, calendar)
}

// FormatSeconds writes a duration in seconds for people: "600ms", "59s",
// "14m32s", "2h", "1d3h", with at most its two largest units (rounded up
// to the millisecond under a second, to the second above).
func FormatSeconds(s float64) string {
	if s <= 0 {
		return "0s"
	}
	if s < 1 {
		return fmt.Sprintf("%dms", int64(math.Ceil(s*1000)))
	}
	left := int64(math.Ceil(s - 1e-9))
	var b bytes.Buffer
	units := 0
	for _, u := range []struct {
		seconds int64
		name    string
	}{{86400, "d"}, {3600, "h"}, {60, "m"}, {1, "s"}} {
		n := left / u.seconds
		if n == 0 && units == 0 {
			continue
		}
		if units == 2 {
			break
		}
		units++
		left -= n * u.seconds
		if n > 0 {
			fmt.Fprintf(&b, "%d%s", n, u.name)
		}
	}
	return b.String()
}
