package bodyscan

// Mutants no test can kill (scripts/mutation.sh ./internal/bodyscan lists
// them as LIVED): each changes no behaviour, for the reason given. Lines
// as of the commit that wrote this note; the mutation is gremlins'.
//
//   - jsonpath.go:45 `i >= len(doc)` to `i > len(doc)`: at i == len(doc)
//     the scan of the number reads nothing, end == i, and the check after
//     it refuses the path before it reads doc[i] (|| stops there).
//   - jsonpath.go:72 and :88 `at >= 0` to `at > 0`: at is -1 or the
//     position of a member's value, which follows at least `{"":`, so it
//     is never 0.
//   - jsonpath.go:254 `b > i` to `b >= i`: doc[i] is the string's opening
//     quote (every caller checks it), not a backslash, so the count of
//     backslashes stops there either way.
//   - jsonpath.go:255 `bs++` to `bs--`: only the parity of the count is
//     read (bs%2 == 0), and -n%2 == 0 exactly when n%2 == 0.
//   - jsonpath.go:628 `r < utf8.RuneSelf` to `r <= utf8.RuneSelf`: U+0080
//     has no case, so the ASCII branch and unicode.SimpleFold both return
//     it unchanged.
//   - scanner.go:185 `len(p) > 0` to `len(p) >= 0`: with p empty, the next
//     line end is not found (-1) and appending the empty rest of p to the
//     line changes nothing before the return.
//   - scanner.go:187 `cr < i` to `cr <= i`: cr and i (the next LF) are
//     positions of different bytes, never equal.
//   - scanner.go:226 `at < 0` to `at <= 0`: at == 0 is looked for again
//     and found again at 0.
//   - scanner.go:326 `end < 0` to `end <= 0`: end == 0 is a body whose
//     document is not an object or array (it holds no path). ReadRequest
//     then returns an empty document and true rather than nil and false;
//     its caller (placeholders.go) refuses both, as Valid refuses an
//     empty document, so no request reads differently.
//
// Mutants that make a test hang (a loop that no longer ends or advances:
// jsonpath.go:260 and :354, scanner.go:205, :211 and :340, decompress.go:153,
// and jsonpath.go:636, which loops on a rune without case) are TIMED OUT:
// the test does not pass, gremlins counts them neither killed nor lived.
