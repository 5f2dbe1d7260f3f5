package jcs_test

import (
	"testing"

	"github.com/toolq/toolq/internal/jcs"
)

// TestMembersSortByEveryUTF16Unit: names are ordered by all their UTF-16 code
// units, as RFC 8785 says, not only by the first unit of the first character
// that differs. Two characters above U+FFFF from one block (👍 U+1F44D and
// 👎 U+1F44E) share their first unit, the high surrogate U+D83D; their second
// units decide. A character in U+E000–U+FFFF sorts after every character
// above U+FFFF, whose first unit is in U+D800–U+DBFF.
func TestMembersSortByEveryUTF16Unit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in, want string }{
		{"sharing a high surrogate", `{"👎":3,"👍":12}`, `{"👍":12,"👎":3}`},
		{"nested, as a model writes votes", `{"votes":{"👎":3,"👍":12}}`, `{"votes":{"👍":12,"👎":3}}`},
		{"escaped and literal", `{"\ud83d\udc4e":3,"👍":12}`, `{"👍":12,"👎":3}`},
		{"after a common prefix", `{"a👎":1,"a👍b":2,"a👍":3}`, `{"a👍":3,"a👍b":2,"a👎":1}`},
		{"the last plane", "{\"\U0010FFFF\":1,\"\U0010FFFE\":2,\"\U00100000\":3}", "{\"\U00100000\":3,\"\U0010FFFE\":2,\"\U0010FFFF\":1}"},
		{"musical symbols (U+D834)", "{\"\U0001D122\":1,\"\U0001D11E\":2}", "{\"\U0001D11E\":2,\"\U0001D122\":1}"},
		{"U+E000..U+FFFF after astral", "{\"\uffff\":1,\"\ue000\":2,\"👍\":3,\"\ufb33\":4,\"\u00e9\":5}", "{\"\u00e9\":5,\"👍\":3,\"\ue000\":2,\"\ufb33\":4,\"\uffff\":1}"},
		{"a prefix first", `{"👍👎":1,"👍":2}`, `{"👍":2,"👍👎":1}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := jcs.Canonicalize([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

// TestLegacyCanonicalIsTheFormBeforeTheFix: LegacyCanonical gives, byte for
// byte, what Canonicalize gave before names were ordered by all their UTF-16
// code units (the wants are that code's outputs), and nil whenever that is
// the canonical form anyway.
func TestLegacyCanonicalIsTheFormBeforeTheFix(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in, want string }{
		{"written order kept", `{"👎":3,"👍":12}`, `{"👎":3,"👍":12}`},
		{"nested in an array", `[1,{"votes":{"👎":3,"👍":12}}]`, `[1,{"votes":{"👎":3,"👍":12}}]`},
		{"after a common prefix", `{"a👎":1,"a👍b":2,"a👍":3}`, `{"a👎":1,"a👍":3,"a👍b":2}`},
		{"the last plane", "{\"\U0010FFFF\":1,\"\U0010FFFE\":2,\"\U00100000\":3}", "{\"\U00100000\":3,\"\U0010FFFF\":1,\"\U0010FFFE\":2}"},
		{"already in order", `{"👍":12,"👎":3}`, ``},
		{"one astral name", "{\"👍\":1,\"\ue000\":2,\"a\":3}", ``},
		{"astral characters in values only", `{"a":"👎","b":"👍"}`, ``},
		{"not an object", `"👎👍"`, ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := jcs.ParseStrict([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if got := v.LegacyCanonical(); string(got) != tc.want || (tc.want == "") != (got == nil) {
				t.Fatalf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}
