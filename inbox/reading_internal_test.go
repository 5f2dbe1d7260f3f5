package inbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/toolq/toolq/internal/jcs"
	"github.com/toolq/toolq/ledger"
)

// awaitingRow is the row of a call awaiting approval with args, which must
// be canonical: their digest is of these bytes.
func awaitingRow(args string) ledger.Row {
	sum := sha256.Sum256([]byte(args))
	return ledger.Row{Key: strings.Repeat("a", 32), Tool: "send_payment", State: ledger.AwaitingApproval,
		ArgsDigest: hex.EncodeToString(sum[:]), ApprovalExpiresAt: time.Now().Add(time.Hour),
		Approval: &ledger.ApprovalInfo{Args: json.RawMessage(args), Group: "finance", TTL: time.Hour}}
}

// canonical is v as canonical JSON.
func canonical(t *testing.T, v any) string {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	canon, err := jcs.Canonicalize(raw)
	if err != nil {
		t.Fatal(err)
	}
	return string(canon)
}

// checkShown fails unless the call shows no character that does not show
// raw: not in the canonical JSON shown, its indented view or a value or
// path listed; and unless the canonical JSON shown is the same JSON value
// as the args digested.
func checkShown(t *testing.T, c call) {
	t.Helper()
	for what, s := range map[string]string{"args_shown": c.ArgsShown, "args_pretty": c.ArgsPretty} {
		if i := strings.IndexFunc(s, func(r rune) bool { return unseen(r) && r != '\n' }); i >= 0 {
			t.Fatalf("%s shows %U raw: %q", what, []rune(s[i:])[0], s)
		}
	}
	for _, f := range c.Fields {
		if strings.ContainsFunc(f.Path+f.Value, unseen) {
			t.Fatalf("the field %q = %q shows a character that does not show raw", f.Path, f.Value)
		}
	}
	again, err := jcs.Canonicalize([]byte(c.ArgsShown))
	if err != nil || string(again) != c.Args {
		t.Fatalf("the args shown %q are not the JSON value of the args %q (%v)", c.ArgsShown, c.Args, err)
	}
}

// TestAKeyThatHoldsACharacterThatDoesNotShowIsFlagged: two keys that read
// the same, "amount_cents" and "amount<U+200B>_cents": the canonical JSON
// reads as a duplicate key whose last value (100) wins, while the tool
// reads amount_cents = 100000. The call and the key's fields are flagged,
// and the key is escaped wherever it is shown.
func TestAKeyThatHoldsACharacterThatDoesNotShowIsFlagged(t *testing.T) {
	t.Parallel()
	for _, args := range []string{
		"{\"amount_cents\":100000,\"amount\u200b_cents\":100}",
		"{\"amount_cents\":100000,\"amount_cents\u202e\":100}",
		"{\"to\":{\"acct\u2060\":\"x\"}}",
	} {
		c := view(awaitingRow(args))
		if !c.ArgsVerified || !c.Unseen {
			t.Errorf("%q: verified %v, flagged %v", args, c.ArgsVerified, c.Unseen)
		}
		hidden := 0
		for _, f := range c.Fields {
			if f.Hidden {
				hidden++
			}
		}
		if hidden != 1 {
			t.Errorf("%q: %d fields flagged, want the one under the key: %+v", args, hidden, c.Fields)
		}
		checkShown(t, c)
	}
}

// defaultIgnorable are the Default_Ignorable_Code_Points of Unicode 15.1
// (DerivedCoreProperties.txt): characters that a renderer draws as
// nothing when it does not support them, and many of which it draws as
// nothing anyway.
var defaultIgnorable = [][2]rune{
	{0x00AD, 0x00AD}, {0x034F, 0x034F}, {0x061C, 0x061C}, {0x115F, 0x1160}, {0x17B4, 0x17B5}, {0x180B, 0x180F},
	{0x200B, 0x200F}, {0x202A, 0x202E}, {0x2060, 0x206F}, {0x3164, 0x3164}, {0xFE00, 0xFE0F}, {0xFEFF, 0xFEFF},
	{0xFFA0, 0xFFA0}, {0xFFF0, 0xFFF8}, {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A}, {0xE0000, 0xE0FFF},
}

// notShowing are the characters the page must flag: every
// Default_Ignorable_Code_Point (unicode.IsPrint calls the variation
// selectors, U+034F, the Hangul fillers and the Khmer inherent vowels
// printable), the controls, every space but U+0020, the line and
// paragraph separators, private-use and unassigned code points, U+FFFD
// and the blank braille pattern.
func notShowing() []rune {
	var rs []rune
	for _, rg := range defaultIgnorable {
		for r := rg[0]; r <= rg[1]; r++ {
			rs = append(rs, r)
		}
	}
	for _, table := range []*unicode.RangeTable{unicode.Cc, unicode.Zs, unicode.Zl, unicode.Zp} {
		for _, r16 := range table.R16 {
			for r := rune(r16.Lo); r <= rune(r16.Hi); r += rune(r16.Stride) {
				if r != ' ' && r != '\n' && r != '\t' {
					rs = append(rs, r)
				}
			}
		}
	}
	return append(rs, 0xE000, 0xF8FF, 0xF0000, 0x10FFFD, 0x0378, 0x2FFFF, 0xFFFD, 0x2800)
}

// TestEveryCharacterThatDoesNotShowIsFlaggedAndEscaped: each of them, in
// a string or a key, flags the call, is written as a \u escape in the
// values listed, the canonical JSON shown and its indented view, which
// stay the args' JSON value.
func TestEveryCharacterThatDoesNotShowIsFlaggedAndEscaped(t *testing.T) {
	t.Parallel()
	for _, r := range notShowing() {
		for _, v := range []any{map[string]string{"to": "acct" + string(r) + "9"}, map[string]int{"acct" + string(r) + "9": 1}} {
			c := view(awaitingRow(canonical(t, v)))
			if !c.Unseen || !c.ArgsVerified || len(c.Fields) != 1 || !c.Fields[0].Hidden {
				t.Fatalf("%U in %q: flagged %v, verified %v, fields %+v", r, c.Args, c.Unseen, c.ArgsVerified, c.Fields)
			}
			checkShown(t, c)
		}
	}
}

// TestCharactersThatShowAreNotFlagged: text of many scripts, accents
// (composed or combining), emoji and the escapes JSON writes itself is
// shown as it is, with nothing flagged.
func TestCharactersThatShowAreNotFlagged(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"acct_9", "naïve café", "cafe\u0301", "日本語のテキスト", "Ελληνικά", "Русский текст", "עברית", "العربية", "한국어",
		"東京Tower", "ラーメンramen", "Pay Иван 100 EUR", "👍🏽 😀", "line\nnext\ttab", "a\\b \"q\"", "<script>&amp;", "1 000,50 €",
	} {
		c := view(awaitingRow(canonical(t, map[string]string{"memo": s, s: "key"})))
		if c.Unseen || len(c.Lookalikes) != 0 || c.ArgsShown != c.Args {
			t.Errorf("%q: flagged %v, lookalikes %q, shown %q", s, c.Unseen, c.Lookalikes, c.ArgsShown)
		}
	}
}

// TestACharacterThatDoesNotShowPastTheListedValuesIsFlagged: past
// maxFields values the page lists no more and says "see the canonical
// JSON"; an override there (which reorders the rest of the one-line JSON
// as drawn) flags the call and is escaped in the JSON shown.
func TestACharacterThatDoesNotShowPastTheListedValuesIsFlagged(t *testing.T) {
	t.Parallel()
	var parts []string
	for i := range maxFields {
		parts = append(parts, fmt.Sprintf(`"k%03d":%d`, i, i))
	}
	parts = append(parts, "\"z_to\":\"acct_9\u202e1\"")
	c := view(awaitingRow("{" + strings.Join(parts, ",") + "}"))
	if !strings.ContainsRune(c.Args, '\u202e') {
		t.Fatal("the canonical args digested lost the override")
	}
	if !c.Unseen || !strings.Contains(c.ArgsShown, `"acct_9\u202e1"`) {
		t.Fatalf("an override in value %d: flagged %v, shown %s", maxFields+1, c.Unseen, c.ArgsShown[len(c.ArgsShown)-40:])
	}
	checkShown(t, c)
}

// TestWordsThatMixScriptsAreFlagged: a word whose letters come from more
// than one script reads as a word of one ("раypal" with a Cyrillic р and
// а); words of one script each, or Latin with Han and kana, do not.
func TestWordsThatMixScriptsAreFlagged(t *testing.T) {
	t.Parallel()
	cases := []struct {
		s    string
		want string // the scripts named; "" for none
	}{
		{"\u0440\u0430ypal.com", "Cyrillic and Latin"},
		{"g\u03bfogle", "Greek and Latin"},
		{"acct_9 \u0430cct", "Cyrillic and Latin"},
		{"\u0561pple", "Armenian and Latin"},
		{"paypal.com", ""},
		{"Pay Иван", ""},
		{"東京Tower", ""},
		{"Ελληνικά", ""},
		{"ab12", ""},
	}
	for _, c := range cases {
		got := strings.Join(mixedScripts(c.s), " and ")
		if got != c.want {
			t.Errorf("%q: %q, want %q", c.s, got, c.want)
		}
		if v := view(awaitingRow(canonical(t, map[string]string{"to": c.s}))); (len(v.Lookalikes) > 0) != (c.want != "") ||
			v.Fields[0].Lookalike != (c.want != "") {
			t.Errorf("%q: lookalikes %q, field %+v", c.s, v.Lookalikes, v.Fields[0])
		}
	}
}

// TestKeysOfOneObjectThatReadAlikeAreFlagged: keys whose confusable
// skeletons are one read as one key, and the canonical JSON as a
// duplicate key whose last value wins; keys of different objects do not
// collide.
func TestKeysOfOneObjectThatReadAlikeAreFlagged(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args string
		want string // the lookalikes, joined by " | "
	}{
		{"{\"amount_cents\":100000,\"\u0430mount_cents\":100}",
			`key "аmount_cents" mixes Cyrillic and Latin letters | keys "amount_cents" and "аmount_cents" of the args read alike`},
		{`{"acct_1":"x","acct_l":"y"}`, `keys "acct_1" and "acct_l" of the args read alike`},
		{"{\"to\":{\"\uff54\uff4f\":1,\"to\":2}}", `keys "to" and "ｔｏ" of to read alike`},
		{`{"burn":1,"bum":2}`, `keys "bum" and "burn" of the args read alike`},
		{"{\"amount\u200b\":1,\"amount\":2}", `keys "amount" and "amount\u200b" of the args read alike`},
		{`{"a":{"x1":1},"b":{"xl":1}}`, ``},
		{`{"Amount":1,"amount":2}`, ``},
	}
	for _, c := range cases {
		v := view(awaitingRow(c.args))
		if got := strings.Join(v.Lookalikes, " | "); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.args, got, c.want)
		}
		flagged := 0
		for _, f := range v.Fields {
			if f.Lookalike {
				flagged++
			}
		}
		if (flagged > 0) != (c.want != "") {
			t.Errorf("%s: %d fields flagged as lookalikes: %+v", c.args, flagged, v.Fields)
		}
	}
}

// TestTheArgsShownAreTheArgsJSONValue: for strings drawn from characters
// that show and characters that do not, in keys and values, the canonical
// JSON shown and its indented view hold no character that does not show
// and are the JSON value of the args; the call is flagged exactly when
// one was drawn.
func TestTheArgsShownAreTheArgsJSONValue(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(27, 6))
	hidden := notShowing()
	shows := []rune("aZ09_ \\\"/<>&é日Жλ👍\u0301")
	for range 2000 {
		draw := func() (string, bool) {
			var b strings.Builder
			any := false
			for range rng.IntN(6) {
				if rng.IntN(4) == 0 {
					r := hidden[rng.IntN(len(hidden))]
					b.WriteRune(r)
					any = any || (r != '\n' && r != '\t')
				} else {
					b.WriteRune(shows[rng.IntN(len(shows))])
				}
			}
			return b.String(), any
		}
		k, hk := draw()
		v, hv := draw()
		c := view(awaitingRow(canonical(t, map[string]any{k: []string{v}, "n": 1})))
		if c.Unseen != (hk || hv) {
			t.Fatalf("%q: flagged %v, want %v", c.Args, c.Unseen, hk || hv)
		}
		checkShown(t, c)
	}
}
