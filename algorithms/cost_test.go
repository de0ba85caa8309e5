package algorithms

import (
	"math"
	"strconv"
	"strings"
	"testing"
)

func TestParseCost(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		want   int64
		wantOK bool
	}{
		{"zero", "0", 0, true},
		{"one", "1", 1000, true},
		{"half", "0.5", 500, true},
		{"rounds up", "0.0004", 1, true},
		{"rounds up above a milli", "0.0015", 2, true},
		{"decimals exact", "2.007", 2007, true},
		{"many decimals", "1.1000000000000", 1100, true},
		{"leading zeros", "007", 7000, true},
		{"zero with decimals", "0.000", 0, true},
		{"no integer part", ".5", 500, true},
		{"no fraction part", "5.", 5000, true},
		{"plus", "+2", 2000, true},
		{"exponent", "1e3", 1_000_000, true},
		{"exponent upper case", "1E-3", 1, true},
		{"exponent plus", "2.5e+1", 25_000, true},
		{"huge is clamped", "1e300", math.MaxInt64 / 4, true},
		{"largest float", "1.7976931348623157e308", math.MaxInt64 / 4, true},
		// Below the smallest float64 ParseFloat returns 0, so nothing is
		// charged; a client that sets its own cost can send 0 anyway.
		{"underflow", "1e-400", 0, true},
		{"64 bytes", strings.Repeat("0", 63) + "1", 1000, true},

		{"empty", "", 0, false},
		{"word", "abc", 0, false},
		{"negative", "-3", 0, false},
		{"negative zero", "-0", 0, false},
		{"negative underflow", "-1e-400", 0, false},
		{"NaN", "NaN", 0, false},
		{"nan", "nan", 0, false},
		{"Inf", "Inf", 0, false},
		{"+Inf", "+Inf", 0, false},
		{"-Inf", "-Inf", 0, false},
		{"infinity", "infinity", 0, false},
		{"overflow", "1e999", 0, false},
		{"just over", "1.8e308", 0, false},
		{"hex", "0x10", 0, false},
		{"hex float", "0x1p4", 0, false},
		{"underscores", "1_000", 0, false},
		{"leading space", " 1", 0, false},
		{"trailing space", "1 ", 0, false},
		{"tab", "\t1", 0, false},
		{"newline", "1\n", 0, false},
		{"comma", "1,5", 0, false},
		{"two points", "1.2.3", 0, false},
		{"point", ".", 0, false},
		{"sign only", "+", 0, false},
		{"two signs", "++1", 0, false},
		{"exponent only", "e5", 0, false},
		{"no exponent digits", "1e", 0, false},
		{"no exponent digits after sign", "1e+", 0, false},
		{"minus inside", "1-2", 0, false},
		{"trailing junk", "0.5x", 0, false},
		{"unit", "1ms", 0, false},
		{"fraction character", "½", 0, false},
		{"arabic digit", "١", 0, false},
		{"NUL", "1\x00", 0, false},
		{"65 bytes", strings.Repeat("0", 64) + "1", 0, false},
		{"10 KB", strings.Repeat("9", 10<<10), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ParseCost(tt.in)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("ParseCost(%q) = %d, %t, want %d, %t", tt.in, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestParseCostAllocs(t *testing.T) {
	for _, s := range []string{"1", "0.5", "1e3", "2.007"} {
		if allocs := testing.AllocsPerRun(100, func() { ParseCost(s) }); allocs != 0 {
			t.Errorf("ParseCost(%q) allocates %v times, want 0", s, allocs)
		}
	}
}

func FuzzParseCost(f *testing.F) {
	for _, s := range []string{
		"", "0", "1", "0.5", "0.0004", "2.007", ".5", "5.", "+2", "1e3", "1E-3",
		"1e300", "1e-400", "-3", "-0", "abc", "NaN", "Inf", "+Inf", "1e999",
		"0x10", "0x1p4", "1_000", " 1", "1 ", "1.2.3", "1e+", "9223372036854775807",
		strings.Repeat("9", 64), strings.Repeat("9", 65),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		milli, ok := ParseCost(s)
		if !ok {
			if milli != 0 {
				t.Errorf("ParseCost(%q) = %d, false, want 0 with false", s, milli)
			}
			// A plain decimal (digits and at most one point) that fits
			// must be accepted.
			if len(s) <= maxCostLen && strings.Count(s, ".") <= 1 && strings.Trim(s, "0123456789.") == "" && strings.Trim(s, ".") != "" {
				t.Errorf("ParseCost(%q) = false, want true", s)
			}
			return
		}
		if milli < 0 {
			t.Fatalf("ParseCost(%q) = %d, true, want >= 0", s, milli)
		}
		if len(s) > maxCostLen || strings.TrimSpace(s) != s {
			t.Fatalf("ParseCost(%q) = %d, true, want false", s, milli)
		}
		if strings.ContainsAny(s, "xXpP_iInN-") && !strings.Contains(s, "e-") && !strings.Contains(s, "E-") {
			t.Fatalf("ParseCost(%q) = %d, true, want false: not a plain decimal", s, milli)
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			t.Fatalf("ParseCost(%q) = %d, true, but ParseFloat = %v, %v", s, milli, v, err)
		}
		if want, _ := CostMilli(v); milli != want {
			t.Fatalf("ParseCost(%q) = %d, want CostMilli(%v) = %d", s, milli, v, want)
		}
		// Never under-charged: milli >= v * 1000, but for the few ulps a
		// decimal loses in binary.
		if m := v * Milli; m < float64(math.MaxInt64/4) && float64(milli) < m*(1-0x1p-49) {
			t.Fatalf("ParseCost(%q) = %d, under %v * 1000", s, milli, v)
		}
	})
}
