package idempotency_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/problem"
)

// contractKey reports whether k is a key the contract accepts: 1 to 255
// characters, each printable ASCII (0x20-0x7E). It is the specification the
// fuzz targets hold the parser to, written independently of ValidateKey.
func contractKey(k string) bool {
	if len(k) == 0 || len(k) > 255 {
		return false
	}
	for _, r := range []byte(k) {
		if r < ' ' || r > '~' {
			return false
		}
	}
	return true
}

// sfString serializes k as an RFC 8941 sf-string: DQUOTE, k with every
// backslash and DQUOTE escaped, DQUOTE.
func sfString(k string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
}

func keyOf(values ...string) (string, error) {
	h := http.Header{}
	for _, v := range values {
		h.Add(idempotency.Header, v)
	}
	return idempotency.KeyFromHeader(h)
}

// FuzzKeyFromHeader holds the Idempotency-Key parser to the contract:
//   - a value it accepts yields a contract key (1..255 printable ASCII);
//     a bare value (not starting with a quote) yields itself, unchanged;
//   - a key in its sf-string form is accepted exactly when it is a contract
//     key, and yields that key: the quoted and the bare forms agree;
//   - a bare contract key not starting with a quote is accepted as itself;
//   - every rejection is idempotency_key_missing (an empty key, bare or
//     quoted) or idempotency_key_invalid, and two headers are always invalid.
func FuzzKeyFromHeader(f *testing.F) {
	for _, seed := range []string{
		"", "k", "8e03978e-40d5-43e8-bc93-6894a57f9324", `"8e03978e-40d5"`, `"a\"b\\c"`, `"`, `""`, `"a`,
		`"a\b"`, `"a"b"`, "order 42", "a\tb", "a\x7fb", "clé", "\x00", strings.Repeat("k", 255),
		strings.Repeat("k", 256), `"` + strings.Repeat("k", 255) + `"`, `"` + strings.Repeat("k", 256) + `"`,
		`"` + strings.Repeat(`\"`, 255) + `"`, ` lead`, `trail `, `\`, `"\"`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		got, err := keyOf(v)
		if err == nil {
			if !contractKey(got) {
				t.Fatalf("%q accepted as %q, which is not a contract key", v, got)
			}
			if !strings.HasPrefix(v, `"`) && got != v {
				t.Fatalf("bare %q yielded %q", v, got)
			}
		} else {
			checkRejection(t, v, err)
		}
		if contractKey(v) && !strings.HasPrefix(v, `"`) && err != nil {
			t.Fatalf("bare contract key %q rejected: %v", v, err)
		}

		// The quoted form of any string: accepted exactly for contract keys,
		// naming the same key.
		q, qerr := keyOf(sfString(v))
		switch {
		case contractKey(v) && (qerr != nil || q != v):
			t.Fatalf("quoted contract key %q: got %q, %v", sfString(v), q, qerr)
		case !contractKey(v) && qerr == nil:
			t.Fatalf("quoted %q accepted as %q, but %q is not a contract key", sfString(v), q, v)
		}
		if err == nil {
			if q2, err2 := keyOf(sfString(got)); err2 != nil || q2 != got {
				t.Fatalf("%q accepted as %q, but its quoted form %q gives %q, %v", v, got, sfString(got), q2, err2)
			}
		}

		if _, err := keyOf(v, v); !errors.Is(err, idempotency.ErrKeyInvalid) && problem.From(err).Code != "idempotency_key_invalid" {
			t.Fatalf("two headers %q: got %v, want idempotency_key_invalid", v, err)
		}
	})
}

func checkRejection(t *testing.T, v string, err error) {
	t.Helper()
	p := problem.From(err)
	want := "idempotency_key_invalid"
	if v == "" || v == `""` { // the empty key, bare or quoted
		want = "idempotency_key_missing"
	}
	if p.Code != want || p.Status != http.StatusBadRequest {
		t.Fatalf("%q rejected with %d %s, want 400 %s", v, p.Status, p.Code, want)
	}
}

// FuzzCanonicalize holds the RFC 8785 canonicalization and the fingerprint
// to their properties, for any two inputs a and b:
//   - the canonical form is valid JSON, and canonicalizing it again gives
//     the same bytes (idempotent);
//   - any re-encoding of a's value (other whitespace, member order, number
//     spellings that parse to the same double, string escapes) has the same
//     canonical bytes and the same fingerprint;
//   - a and b have the same canonical bytes (and fingerprint) exactly when
//     they are the same JSON value (numbers compared as doubles);
//   - changing one leaf of a's value changes the fingerprint.
func FuzzCanonicalize(f *testing.F) {
	for _, seed := range []struct {
		a, b string
		seed uint8
	}{
		{`{"email":"buyer@example.com","items":[{"sku":"sku_tee","quantity":2}],"payment_method":"pm_card_visa"}`,
			`{ "payment_method":"pm_card_visa", "items":[{"quantity":2.0,"sku":"sku_tee"}],"email":"buyer@example.com"}`, 1},
		{`{"a":1,"b":[1,2],"c":{"x":"y"}}`, `{"a":1,"b":[2,1],"c":{"x":"y"}}`, 2},
		{`[1e0, 10e-1, 0.1e1, -0, 0]`, `[1,1,1,0,0]`, 3},
		{`{"\u00e9":"\ud83d\ude00","e\u0301":"\/"}`, `{"é":"😀","é":"/"}`, 4},
		{`1.7976931348623157e308`, `5e-324`, 5},
		{`123456789012345678901234567890`, `1.2345678901234568e29`, 6},
		{`{"a":1,"a":2}`, `{}`, 7},
		{`"\u0000\u001f\"\\"`, `null`, 8},
		{`[true,false,null,"",{},[]]`, `[true,false,null,"",{},[ ]]`, 9},
		{`{"\ud800":1}`, `"\udfff"`, 10},
		{"\"\xff\"", "\"\xfe\"", 11},
		{`1e400`, `-1e400`, 12},
		{`0.000001`, `1e-7`, 13},
		{`{"b":{"z":1,"a":[{"y":2,"x":1}]}}`, `{"b":{"a":[{"x":1,"y":2}],"z":1}}`, 14},
	} {
		f.Add([]byte(seed.a), []byte(seed.b), seed.seed)
	}
	const route = "POST /v1/checkouts"
	// seed is a uint8 on purpose: go test's minimizer shrinks an integer
	// one by one, which for a uint64 can outlast the fuzz run.
	f.Fuzz(func(t *testing.T, a, b []byte, seed uint8) {
		if len(a) > 4096 || len(b) > 4096 {
			return
		}
		ca, err := idempotency.Canonicalize(a)
		if err != nil {
			if p := problem.From(err); p.Code != "malformed_json" || p.Status != http.StatusBadRequest {
				t.Fatalf("Canonicalize(%q): %v, want a 400 malformed_json problem", a, err)
			}
			return
		}
		if !json.Valid(ca) {
			t.Fatalf("Canonicalize(%q) = %q, not valid JSON", a, ca)
		}
		again, err := idempotency.Canonicalize(ca)
		if err != nil || !bytes.Equal(again, ca) {
			t.Fatalf("not idempotent: %q -> %q -> %q, %v", a, ca, again, err)
		}
		va, ok := decode(a)
		if !ok {
			// Valid for RFC 8785 but not for encoding/json: nothing to
			// compare it with (the seeds show there is no such input).
			t.Fatalf("Canonicalize accepted %q, which encoding/json rejects", a)
		}
		fpa := fp(t, route, a)

		rng := rand.New(rand.NewPCG(uint64(seed), uint64(seed)^0x9e3779b97f4a7c15))
		for i := 0; i < 4; i++ {
			re := reencode(rng, va)
			cre, err := idempotency.Canonicalize(re)
			if err != nil || !bytes.Equal(cre, ca) {
				t.Fatalf("re-encoding %q of %q: canonical %q, want %q (%v)", re, a, cre, ca, err)
			}
			if got := fp(t, route, re); got != fpa {
				t.Fatalf("re-encoding %q of %q: another fingerprint", re, a)
			}
		}

		if changed, ok := mutate(rng, va); ok {
			other, _ := json.Marshal(changed)
			if fp(t, route, other) == fpa {
				t.Fatalf("%q and its changed value %q have the same fingerprint", a, other)
			}
		}

		cb, err := idempotency.Canonicalize(b)
		if err != nil {
			return
		}
		vb, ok := decode(b)
		if !ok {
			t.Fatalf("Canonicalize accepted %q, which encoding/json rejects", b)
		}
		same := reflect.DeepEqual(va, vb)
		if same != bytes.Equal(ca, cb) {
			t.Fatalf("values equal: %v, canonical forms equal: %v\na=%q -> %q\nb=%q -> %q", same, !same, a, ca, b, cb)
		}
		if same != (fpa == fp(t, route, b)) {
			t.Fatalf("values equal: %v, but the fingerprints disagree: %q, %q", same, a, b)
		}
	})
}

func fp(t *testing.T, route string, body []byte) string {
	t.Helper()
	s, err := idempotency.Fingerprint("POST", route, body)
	if err != nil {
		t.Fatalf("Fingerprint(%q): %v", body, err)
	}
	return s
}

// decode parses b as one JSON value with numbers as float64, the model of
// "the same JSON value" these properties use. Invalid UTF-8 is not
// compared: encoding/json silently replaces it, so two different byte
// strings would decode alike.
func decode(b []byte) (any, bool) {
	if !utf8.Valid(b) {
		return nil, false
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, false
	}
	return v, true
}

// reencode writes v as JSON with random whitespace, member order, number
// spellings of the same double and string escapes.
func reencode(rng *rand.Rand, v any) []byte {
	var buf bytes.Buffer
	var write func(v any)
	ws := func() {
		for n := rng.IntN(3); n > 0; n-- {
			buf.WriteByte(" \t\n\r"[rng.IntN(4)])
		}
	}
	write = func(v any) {
		ws()
		switch v := v.(type) {
		case nil:
			buf.WriteString("null")
		case bool:
			buf.WriteString(strconv.FormatBool(v))
		case float64:
			buf.WriteString(spellNumber(rng, v))
		case string:
			writeString(rng, &buf, v)
		case []any:
			buf.WriteByte('[')
			for i, e := range v {
				if i > 0 {
					buf.WriteByte(',')
				}
				write(e)
			}
			ws()
			buf.WriteByte(']')
		case map[string]any:
			names := make([]string, 0, len(v))
			for k := range v {
				names = append(names, k)
			}
			slices.Sort(names)
			rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
			buf.WriteByte('{')
			for i, k := range names {
				if i > 0 {
					buf.WriteByte(',')
				}
				ws()
				writeString(rng, &buf, k)
				ws()
				buf.WriteByte(':')
				write(v[k])
			}
			ws()
			buf.WriteByte('}')
		default:
			panic(fmt.Sprintf("reencode: %T", v))
		}
		ws()
	}
	write(v)
	return buf.Bytes()
}

// spellNumber returns a JSON spelling of f that parses to exactly f.
func spellNumber(rng *rand.Rand, f float64) string {
	if f == 0 {
		return []string{"0", "-0", "0.0", "0e0", "-0.000E+12"}[rng.IntN(5)]
	}
	short := strconv.FormatFloat(f, 'g', -1, 64)
	switch rng.IntN(5) {
	case 0:
		return short
	case 1: // scientific, capital E, explicit plus sign, padded exponent
		mant, exp, _ := strings.Cut(strconv.FormatFloat(f, 'e', -1, 64), "e")
		n, _ := strconv.Atoi(exp)
		sign := "+"
		if n < 0 {
			sign, n = "-", -n
		}
		return mant + "E" + sign + fmt.Sprintf("%03d", n)
	case 2: // plain decimal with trailing zeros, when not too long
		if math.Abs(f) < 1e21 && math.Abs(f) >= 1e-6 {
			s := strconv.FormatFloat(f, 'f', -1, 64)
			if !strings.Contains(s, ".") {
				s += "."
			}
			return s + "000"
		}
		return short
	case 3: // the mantissa shifted: 12.5 as 125e-1
		mant, exp, _ := strings.Cut(strconv.FormatFloat(f, 'e', -1, 64), "e")
		n, _ := strconv.Atoi(exp)
		neg := strings.HasPrefix(mant, "-")
		digits := strings.ReplaceAll(strings.TrimPrefix(mant, "-"), ".", "")
		s := digits + "e" + strconv.Itoa(n-(len(digits)-1))
		if neg {
			s = "-" + s
		}
		return s
	default: // 0.000125e4 for 1.25
		mant, exp, _ := strings.Cut(strconv.FormatFloat(f, 'e', -1, 64), "e")
		n, _ := strconv.Atoi(exp)
		neg := strings.HasPrefix(mant, "-")
		digits := strings.ReplaceAll(strings.TrimPrefix(mant, "-"), ".", "")
		s := "0.000" + digits + "e" + strconv.Itoa(n+4)
		if neg {
			s = "-" + s
		}
		return s
	}
}

// writeString writes s as a JSON string, each character literal or
// escaped at random (always escaped where JSON requires it).
func writeString(rng *rand.Rand, buf *bytes.Buffer, s string) {
	buf.WriteByte('"')
	for _, r := range s {
		must := r < 0x20 || r == '"' || r == '\\'
		switch {
		case !must && rng.IntN(3) > 0:
			buf.WriteRune(r)
		case r == '"' && rng.IntN(2) == 0:
			buf.WriteString(`\"`)
		case r == '\\' && rng.IntN(2) == 0:
			buf.WriteString(`\\`)
		case r == '/' && rng.IntN(2) == 0:
			buf.WriteString(`\/`)
		case r == '\n' && rng.IntN(2) == 0:
			buf.WriteString(`\n`)
		case r > 0xffff:
			r1, r2 := utf16Pair(r)
			fmt.Fprintf(buf, `\u%04x\u%04X`, r1, r2)
		default:
			if rng.IntN(2) == 0 {
				fmt.Fprintf(buf, `\u%04x`, r)
			} else {
				fmt.Fprintf(buf, `\u%04X`, r)
			}
		}
	}
	buf.WriteByte('"')
}

func utf16Pair(r rune) (rune, rune) {
	r -= 0x10000
	return 0xd800 + (r>>10)&0x3ff, 0xdc00 + r&0x3ff
}

// mutate returns a copy of v with one leaf changed (a number, string, bool
// or null replaced by another value, or a member added to an object), and
// false when v offers nothing to change.
func mutate(rng *rand.Rand, v any) (any, bool) {
	switch v := v.(type) {
	case nil:
		return false, true
	case bool:
		return !v, true
	case float64:
		if v == math.MaxFloat64 {
			return v / 2, true
		}
		if n := math.Nextafter(v, math.Inf(1)); !math.IsInf(n, 0) {
			return n, true
		}
		return v / 2, true
	case string:
		return v + "x", true
	case []any:
		if len(v) == 0 {
			return []any{nil}, true
		}
		i := rng.IntN(len(v))
		c := slices.Clone(v)
		var ok bool
		c[i], ok = mutate(rng, v[i])
		return c, ok
	case map[string]any:
		c := make(map[string]any, len(v)+1)
		for k, e := range v {
			c[k] = e
		}
		if len(v) == 0 || rng.IntN(4) == 0 {
			k := "added"
			for _, taken := c[k]; taken; _, taken = c[k] {
				k += "_"
			}
			c[k] = nil
			return c, true
		}
		names := make([]string, 0, len(v))
		for k := range v {
			names = append(names, k)
		}
		slices.Sort(names)
		k := names[rng.IntN(len(names))]
		var ok bool
		c[k], ok = mutate(rng, v[k])
		return c, ok
	}
	return nil, false
}
