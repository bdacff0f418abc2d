package checkout

import "testing"

func TestCheckEmail(t *testing.T) {
	t.Parallel()
	valid := []string{
		"buyer@example.com", "first.last+tag@sub.example.co.uk", "josé@exämple.com",
		"buyer@xn--exmple-cua.com", "a@b.io", "用户@例子.广告",
	}
	invalid := []string{
		"", "plain", "@example.com", "buyer@", "buyer@localhost", "buyer@example.",
		"b@-example.com", "b@example-.com", "b@ex_ample.com", "b@example.c", "a@[127.0.0.1]",
		"b@exa\u200dmple.com", "b@١٢٣.com", "b@example.123", "Bob <bob@example.com>",
		"a\x00b@example.com", "a b@example.com",
	}
	for _, s := range valid {
		if msg := checkEmail(s); msg != "" {
			t.Errorf("checkEmail(%q) = %q, want valid", s, msg)
		}
	}
	for _, s := range invalid {
		if checkEmail(s) == "" {
			t.Errorf("checkEmail(%q) accepted an address mail cannot reach", s)
		}
	}
}
