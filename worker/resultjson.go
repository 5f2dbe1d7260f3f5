package worker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/toolq/toolq/jobs"
)

// marshal encodes a result as encoding/json does with HTML escaping off,
// byte for byte, without its reflection: every delivery's answer is
// encoded, and reflection was a twentieth of a duplicate's CPU. A result
// with an approval, rare, goes through encoding/json itself.
func marshal(r *jobs.Result) ([]byte, error) {
	size := len(r.Output) + 320
	if r.Error != nil {
		size += len(r.Error.Message) + len(r.Error.Code)
	}
	if r.Approval != nil {
		return marshalReflect(r, size)
	}
	b := make([]byte, 0, size)
	b = append(b, `{"version":`...)
	b = strconv.AppendInt(b, int64(r.Version), 10)
	b = append(b, `,"key":`...)
	b = appendString(b, r.Key)
	b = append(b, `,"conversation_id":`...)
	b = appendString(b, r.ConversationID)
	b = append(b, `,"turn_index":`...)
	b = strconv.AppendInt(b, r.TurnIndex, 10)
	b = append(b, `,"ordinal":`...)
	b = strconv.AppendInt(b, r.Ordinal, 10)
	b = append(b, `,"tool":`...)
	b = appendString(b, r.Tool)
	b = append(b, `,"tool_use_id":`...)
	b = appendString(b, r.ToolUseID)
	b = append(b, `,"status":`...)
	b = appendString(b, string(r.Status))
	if len(r.Output) > 0 {
		b = append(b, `,"output":`...)
		out := bytes.NewBuffer(b)
		if err := json.Compact(out, r.Output); err != nil { // as encoding/json checks and compacts a RawMessage
			return nil, fmt.Errorf("output: %w", err)
		}
		b = out.Bytes()
	}
	if r.Error != nil {
		b = append(b, `,"error":{"code":`...)
		b = appendString(b, r.Error.Code)
		b = append(b, `,"message":`...)
		b = appendString(b, r.Error.Message)
		b = append(b, '}')
	}
	b = append(b, `,"duplicate":`...)
	b = strconv.AppendBool(b, r.Duplicate)
	if r.OriginalToolUseID != "" {
		b = append(b, `,"original_tool_use_id":`...)
		b = appendString(b, r.OriginalToolUseID)
	}
	b = append(b, `,"attempts":`...)
	b = strconv.AppendInt(b, int64(r.Attempts), 10)
	b = append(b, `,"completed_at":"`...)
	b, err := r.CompletedAt.AppendText(b) // what time.Time's MarshalJSON writes, and refuses
	if err != nil {
		return nil, fmt.Errorf("completed_at: %w", err)
	}
	b = append(b, '"')
	if r.Tenant != "" {
		b = append(b, `,"tenant":`...)
		b = appendString(b, r.Tenant)
	}
	return append(b, '}'), nil
}

// marshalReflect is marshal by encoding/json.
func marshalReflect(r *jobs.Result, size int) ([]byte, error) {
	return encodeJSON(r, size)
}

// marshalApproval encodes a result's approval as marshal writes it.
func marshalApproval(a *jobs.ResultApproval) ([]byte, error) {
	return encodeJSON(a, len(a.Args)+512)
}

// encodeJSON is encoding/json with HTML escaping off.
func encodeJSON(v any, size int) ([]byte, error) {
	var b bytes.Buffer
	b.Grow(size)
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// appendString appends s as a JSON string, as encoding/json writes it with
// HTML escaping off. The ids and statuses of a result are printable ASCII
// and are copied as they are; any other string is written by encoding/json.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' {
			return appendStringSlow(b, s)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func appendStringSlow(b []byte, s string) []byte {
	buf := bytes.NewBuffer(b)
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}
