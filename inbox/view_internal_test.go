package inbox

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestArgsAreListedOnePathPerValueWithWhatDoesNotShowEscaped: the values an
// approver reads are the args' literals in their order (numbers as
// written, however large), one per path, with every character that does
// not show (controls, bidirectional overrides, zero-width and tag
// characters) escaped and flagged.
func TestArgsAreListedOnePathPerValueWithWhatDoesNotShowEscaped(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args string
		want string // path=value lines; a ! marks a hidden character
	}{
		{`{"amount_cents":90000,"to":"acct_9"}`, "amount_cents=90000 to=\"acct_9\""},
		{`{"n":123456789012345678901234567890,"f":1e-7,"t":true,"z":null}`, "n=123456789012345678901234567890 f=1e-7 t=true z=null"},
		{`{"a":{"b":[1,{"c":"x"}],"e":{},"l":[]}}`, `a.b[0]=1 a.b[1].c="x" a.e={} a.l=[]`},
		{`{"odd key":1,"é":2,"a\"b":3}`, `["odd key"]=1 ["é"]=2 ["a\"b"]=3`},
		{`{}`, ``},
		{`{"s":"line\nnext\ttab \\ \"q\""}`, `s="line\nnext\ttab \\ \"q\""`},
		{`{"to":"acct_9\u202e1"}`, `to="acct_9\u202e1"!`},
		{`{"to":"pay\u200bme"}`, `to="pay\u200bme"!`},
		{`{"to":"a\u0007b"}`, `to="a\u0007b"!`},
		{`{"to":"x` + "\U000E0041" + `"}`, `to="x\udb40\udc41"!`},
		{`{"to":"naïve 日本 👍"}`, `to="naïve 日本 👍"`},
	}
	for _, c := range cases {
		var got []string
		for _, f := range fields(json.RawMessage(c.args)) {
			line := f.Path + "=" + f.Value
			if f.Hidden {
				line += "!"
			}
			got = append(got, line)
		}
		if strings.Join(got, " ") != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.args, strings.Join(got, " "), c.want)
		}
	}
}

func TestLongArgsListTheirFirstValuesAndSayHowManyMore(t *testing.T) {
	t.Parallel()
	var parts []string
	for i := range maxFields + 5 {
		parts = append(parts, fmt.Sprintf(`"k%03d":%d`, i, i))
	}
	got := fields(json.RawMessage("{" + strings.Join(parts, ",") + "}"))
	if len(got) != maxFields+1 || got[maxFields].Kind != "more" || !strings.HasPrefix(got[maxFields].Value, "5 more values") {
		t.Fatalf("%d fields, last %+v", len(got), got[len(got)-1])
	}
}
