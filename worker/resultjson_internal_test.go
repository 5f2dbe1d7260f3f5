package worker

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/jsontest"
	"github.com/toolq/toolq/jobs"
)

// TestResultsAreEncodedAsEncodingJSONEncodesThem: the result encoder writes
// every result byte for byte as encoding/json does with HTML escaping off
// (what results were before, and what every client decodes): strings with
// quotes, control characters, HTML, U+2028, astral characters and invalid
// UTF-8; outputs spelt with whitespace; every optional member present or
// not; times in other zones and years it must refuse; outputs that are not
// JSON, refused by both.
func TestResultsAreEncodedAsEncodingJSONEncodesThem(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(2026, 12))
	pieces := []string{"a", "Z", "0", "_", "-", " ", `"`, `\`, "/", "<", ">", "&", "\n", "\t", "\x00", "\x1f", "\x7f",
		"é", "€", "\u2028", "\u2029", "👍", "\xff", "\xe2\x80", "\xed\xa0\x80", "\ufffd"}
	str := func() string {
		var b strings.Builder
		for range rng.IntN(12) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		return b.String()
	}
	zones := []*time.Location{time.UTC, time.FixedZone("", 5*3600+30*60), time.FixedZone("X", -7*3600)}
	statuses := []jobs.Status{jobs.StatusOK, jobs.StatusError, jobs.StatusRejected, jobs.StatusIndeterminate, jobs.Status(str())}
	for i := range 5000 {
		r := &jobs.Result{Version: rng.IntN(3), Key: str(), ConversationID: str(), TurnIndex: rng.Int64N(1 << 53), Ordinal: rng.Int64N(40) - 2,
			Tool: str(), ToolUseID: str(), Status: statuses[rng.IntN(len(statuses))], Duplicate: rng.IntN(2) == 0, Attempts: rng.IntN(5) - 1,
			CompletedAt: time.Unix(rng.Int64N(4e9), rng.Int64N(2e9)).In(zones[rng.IntN(len(zones))])}
		switch rng.IntN(8) {
		case 0: // none
		case 1:
			r.Output = json.RawMessage(`{"a":` + str()) // not JSON
		case 2:
			r.Output = json.RawMessage(" [1, 2 ,\n\"" + strings.ReplaceAll(str(), `"`, "") + "\"] ")
		default:
			r.Output = json.RawMessage(jsontest.RandomObject(rng))
		}
		if rng.IntN(2) == 0 {
			r.Error = &jobs.ResultError{Code: str(), Message: str()}
		}
		if rng.IntN(3) == 0 {
			r.OriginalToolUseID = str()
		}
		if rng.IntN(3) == 0 {
			r.Tenant = str()
		}
		if rng.IntN(50) == 0 {
			r.CompletedAt = time.Date(10000+rng.IntN(3), 1, 1, 0, 0, 0, 0, time.UTC) // beyond RFC 3339
		}
		if rng.IntN(50) == 0 {
			r.Approval = &jobs.ResultApproval{Args: json.RawMessage(`{"x":1}`), Group: str(), RequestedAt: r.CompletedAt}
		}
		want, wantErr := marshalReflect(r, 0)
		got, err := marshal(r)
		if (err != nil) != (wantErr != nil) || string(got) != string(want) {
			t.Fatalf("result %d %+v:\n got  %s (%v)\n want %s (%v)", i, r, got, err, want, wantErr)
		}
	}
}
