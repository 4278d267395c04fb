package dataset

// pow10 holds the powers of ten a float64 represents exactly.
var pow10 = [...]float64{1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10,
	1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22}

// parseDecimal parses the cells that are plain decimals and quick to read
// exactly: [+-]digits[.digits][(e|E)[+-]digits], at most 19 digits, whose
// integer of all the digits is below 2^53 and whose power of ten is within
// 10^±22. Both are then exact float64s, and one multiplication or division
// of them is the correctly rounded value of the decimal (Clinger's fast
// path): what strconv.ParseFloat returns, bit for bit, as it takes the same
// path. CSV files of numbers are mostly such cells, and reading them here
// skips ParseFloat's general syntax (signs of Inf and NaN, hexadecimal,
// underscores, long mantissas). ok is false for anything else, which the
// caller hands to ParseFloat.
func parseDecimal(s string) (v float64, ok bool) {
	i, n := 0, len(s)
	neg := false
	if i < n && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	var mant uint64
	digits, exp := 0, 0
	seenDot := false
	for ; i < n; i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			mant = mant*10 + uint64(c-'0')
			digits++
			if seenDot {
				exp--
			}
		case c == '.' && !seenDot:
			seenDot = true
		default:
			goto tail
		}
	}
tail:
	if digits == 0 || digits > 19 || mant >= 1<<53 {
		return 0, false
	}
	if i < n {
		e, ok := parseExponent(s[i:])
		if !ok {
			return 0, false
		}
		exp += e
	}
	f := float64(mant)
	if neg {
		f = -f
	}
	switch {
	case exp == 0:
		return f, true
	case exp > 0 && exp < len(pow10):
		return f * pow10[exp], true
	case exp < 0 && -exp < len(pow10):
		return f / pow10[-exp], true
	}
	return 0, false
}

// parseExponent parses a decimal's exponent part, (e|E)[+-]digits with at
// most three characters after the e (the fast path needs |e| <= 22 anyway).
func parseExponent(s string) (e int, ok bool) {
	i, n := 0, len(s)
	if n == 0 || (s[0] != 'e' && s[0] != 'E') {
		return 0, false
	}
	i++
	neg := false
	if i < n && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	if i == n || n-i > 3 {
		return 0, false
	}
	for ; i < n; i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		e = e*10 + int(c-'0')
	}
	if neg {
		e = -e
	}
	return e, true
}
