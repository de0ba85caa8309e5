package algorithms

import "strconv"

// maxCostLen bounds the cost strings ParseCost looks at. A cost is a
// client-controlled placeholder (a header, a query parameter); no number a
// person means to send is longer, and a long one is rejected unread.
const maxCostLen = 64

// ParseCost parses a request's cost, such as a resolved placeholder "0.5",
// into milli-units with CostMilli: rounding up, and clamping a huge cost to a
// value above every capacity. It reports false for anything ParseNumber
// refuses. It does not allocate when it succeeds.
func ParseCost(s string) (milli int64, ok bool) {
	f, ok := ParseNumber(s)
	if !ok {
		return 0, false
	}
	return CostMilli(f)
}

// ParseNumber reads s as a finite decimal number >= 0, as a cost is read.
// It reports false for the empty string, words such as "NaN" and "Inf", a
// minus sign, hexadecimal or underscored forms that strconv.ParseFloat
// would accept, surrounding spaces, a number too large for a float64
// ("1e999"), and any string longer than 64 bytes.
func ParseNumber(s string) (float64, bool) {
	if len(s) == 0 || len(s) > maxCostLen {
		return 0, false
	}
	// Admit only the characters of plain decimal and exponent forms, so that
	// ParseFloat's other syntaxes (0x1p4, 1_000, Inf, NaN) never reach it.
	// A leading '-' is refused outright: even "-0" and "-1e-400", which
	// ParseFloat reads as zero, are written as negative numbers.
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case '0' <= c && c <= '9', c == '.', c == 'e', c == 'E', c == '+':
		case c == '-' && i > 0 && (s[i-1] == 'e' || s[i-1] == 'E'):
		default:
			return 0, false
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil { // malformed, or out of range ("1e999")
		return 0, false
	}
	return f, true
}
