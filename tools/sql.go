package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// SQL is the executor of a transactional_write whose effect is one
// statement in the ledger's own Postgres database, run in the transaction
// that completes the call (see TxExecutor).
//
// Its parameters are named, @name, and bound as parameters, never written
// into the statement's text: @name is the args' top-level member name,
// which the tool's schema must declare in its top-level properties (an
// absent member or null is NULL), or one of toolq's own: @key (the call's
// idempotency key), @conversation_id, @turn_index and @tool_use_id. A
// member is bound as text, which Postgres reads as the parameter's type: a
// string as its value, a number as its canonical form writes it (the
// shortest decimal of its double: CheckArgs refuses a number that is not
// exactly that value, such as 1.000000000000000001), true and false, an
// object or an array as its JSON (for a json or jsonb parameter).
type SQL struct {
	// Statement is one SELECT, INSERT, UPDATE, DELETE, MERGE, WITH, VALUES
	// or CALL statement, with no positional parameter ($1). None of these
	// can end the transaction (a procedure that commits fails inside one).
	Statement string
	// Output is what a call answers: "rows" (the default: the rows the
	// statement returns, as an array of objects by column name), "row"
	// (exactly one row, as an object; no row or more than one is a definite
	// failure, and the transaction rolls back) or "affected"
	// ({"rows_affected": n}). A column is a JSON number, boolean or JSON
	// value for Postgres's numbers, booleans and json/jsonb, null for NULL,
	// and otherwise the string Postgres writes for it (timestamps as
	// 2026-01-02 03:04:05+00).
	Output string
	// MaxOutputBytes bounds the output (default 1 MiB): a larger one is a
	// definite failure, and the transaction rolls back.
	MaxOutputBytes int64

	params []string // the names the statement binds, in the order of their first use
}

// The outputs of an SQL executor.
const (
	SQLRows     = "rows"
	SQLRow      = "row"
	SQLAffected = "affected"
)

// toolqParams are the parameters toolq binds itself, by name.
var toolqParams = []string{"key", "conversation_id", "turn_index", "tool_use_id"}

// sqlKinds are the statements an SQL executor runs: none of them can end
// the transaction it runs in.
var sqlKinds = []string{"SELECT", "INSERT", "UPDATE", "DELETE", "MERGE", "WITH", "VALUES", "CALL"}

// SQLExecutor checks s and returns a copy with its defaults filled. It
// fails for an empty statement, one that is not one statement of the kinds
// Statement lists (a BEGIN, COMMIT or SET among them, or two statements),
// one with a positional parameter ($1), and an unknown output. The
// parameters are checked against the tool's schema by NewRegistry.
func SQLExecutor(s SQL) (*SQL, error) {
	stmt := strings.TrimSpace(s.Statement)
	if stmt == "" {
		return nil, errors.New("statement: missing")
	}
	kind, err := scanStatement(stmt)
	if err != nil {
		return nil, fmt.Errorf("statement: %w", err)
	}
	if !slices.Contains(sqlKinds, kind) {
		return nil, fmt.Errorf("statement: a %s statement cannot run in the call's transaction (want one of %s)", cutWord(kind), strings.Join(sqlKinds, ", "))
	}
	switch s.Output {
	case "":
		s.Output = SQLRows
	case SQLRows, SQLRow, SQLAffected:
	default:
		return nil, fmt.Errorf("output: %q: want rows, row or affected", s.Output)
	}
	if s.MaxOutputBytes < 0 {
		return nil, errors.New("max_output_bytes: must be positive")
	}
	if s.MaxOutputBytes == 0 {
		s.MaxOutputBytes = DefaultMaxResponse
	}
	if s.params, err = namedParams(s.Statement); err != nil {
		return nil, fmt.Errorf("statement: %w", err)
	}
	return &s, nil
}

// Params returns the names the statement binds, in the order of their
// first use.
func (s *SQL) Params() []string { return slices.Clone(s.params) }

// scanStatement reads stmt as Postgres's lexer does (standard-conforming
// strings) and returns its kind: its first keyword, upper-cased, after
// white space, comments (which nest) and opening parentheses. It refuses a
// second statement after a semicolon (one or more semicolons may end the
// statement), a positional parameter ($1), and an unterminated comment,
// string, quoted identifier or dollar-quoted string. The extended protocol
// the statement runs with refuses two statements as well: this says so
// when the registry loads.
func scanStatement(stmt string) (kind string, err error) {
	ended := false // a semicolon was read: only white space and comments may follow
	first := true  // no token read yet but opening parentheses
	for i := 0; i < len(stmt); {
		c := stmt[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
			continue
		case strings.HasPrefix(stmt[i:], "--"):
			end := strings.IndexByte(stmt[i:], '\n')
			if end < 0 {
				return kind, nil
			}
			i += end + 1
			continue
		case strings.HasPrefix(stmt[i:], "/*"):
			end, err := blockComment(stmt, i)
			if err != nil {
				return "", err
			}
			i = end
			continue
		}
		if ended {
			if c == ';' {
				i++
				continue
			}
			return "", errors.New("two statements: a sql executor runs one")
		}
		switch {
		case c == ';':
			ended = true
			i++
		case c == '(' && first:
			i++
		case isIdentStart(c):
			end := i + 1
			for end < len(stmt) && (isIdentStart(stmt[end]) || stmt[end] >= '0' && stmt[end] <= '9' || stmt[end] == '$') {
				end++
			}
			if first {
				kind, first = strings.ToUpper(stmt[i:end]), false
			}
			if end-i == 1 && (c == 'E' || c == 'e') && end < len(stmt) && stmt[end] == '\'' { // an escape string
				if i, err = quoted(stmt, end, true); err != nil {
					return "", err
				}
				continue
			}
			i = end
		case c == '\'' || c == '"':
			first = false
			if i, err = quoted(stmt, i, false); err != nil {
				return "", err
			}
		case c == '$':
			first = false
			if i+1 < len(stmt) && stmt[i+1] >= '0' && stmt[i+1] <= '9' {
				return "", errors.New("a positional parameter ($1) is not supported: name it (@name)")
			}
			if i, err = dollarQuoted(stmt, i); err != nil {
				return "", err
			}
		default:
			first = false
			i++
		}
	}
	return kind, nil
}

// isIdentStart: a byte that begins an identifier or a keyword (any byte of
// a multi-byte UTF-8 character does).
func isIdentStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

// blockComment returns the end of the block comment at stmt[i:], which
// nests as Postgres's do.
func blockComment(stmt string, i int) (int, error) {
	depth := 0
	for i < len(stmt) {
		switch {
		case strings.HasPrefix(stmt[i:], "/*"):
			depth++
			i += 2
		case strings.HasPrefix(stmt[i:], "*/"):
			depth--
			i += 2
			if depth == 0 {
				return i, nil
			}
		default:
			i++
		}
	}
	return 0, errors.New("an unterminated /* comment")
}

// quoted returns the end of the string or quoted identifier whose opening
// quote is stmt[i]: a doubled quote is one quote, and in an escape string
// (E'…') a backslash escapes the byte after it.
func quoted(stmt string, i int, escapes bool) (int, error) {
	q := stmt[i]
	for i++; i < len(stmt); i++ {
		switch {
		case escapes && stmt[i] == '\\':
			i++
		case stmt[i] == q && i+1 < len(stmt) && stmt[i+1] == q:
			i++
		case stmt[i] == q:
			return i + 1, nil
		}
	}
	return 0, fmt.Errorf("an unterminated %c", q)
}

// dollarQuoted returns the end of the dollar-quoted string ($$…$$,
// $tag$…$tag$) that begins at stmt[i], or i+1 for a $ that begins none
// (Postgres refuses it when it runs).
func dollarQuoted(stmt string, i int) (int, error) {
	end := i + 1
	for end < len(stmt) && (isIdentStart(stmt[end]) || end > i+1 && stmt[end] >= '0' && stmt[end] <= '9') {
		end++
	}
	if end >= len(stmt) || stmt[end] != '$' {
		return i + 1, nil
	}
	tag := stmt[i : end+1]
	closing := strings.Index(stmt[end+1:], tag)
	if closing < 0 {
		return 0, fmt.Errorf("an unterminated %s string", tag)
	}
	return end + 1 + closing + len(tag), nil
}

func cutWord(w string) string {
	if w == "" {
		return "statement that does not begin with a keyword"
	}
	return w
}

// namedParams are the names of the @name parameters pgx's named arguments
// find in stmt, in the order of their first use. It asks pgx's own lexer
// (which leaves alone an @ in a string, a quoted identifier, a comment or
// an operator such as @>): pgx writes $n for the n-th name, and the names
// are where its text differs from stmt.
func namedParams(stmt string) ([]string, error) {
	rewritten, args, err := pgx.NamedArgs{}.RewriteQuery(context.Background(), nil, stmt, nil)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(args))
	for i, j := 0, 0; i < len(stmt) && j < len(rewritten); {
		if stmt[i] == rewritten[j] {
			i, j = i+1, j+1
			continue
		}
		if stmt[i] != '@' || rewritten[j] != '$' {
			return nil, fmt.Errorf("cannot read its parameters at byte %d", i)
		}
		end := i + 1
		for end < len(stmt) && isNameByte(stmt[end]) {
			end++
		}
		digits := j + 1
		for digits < len(rewritten) && rewritten[digits] >= '0' && rewritten[digits] <= '9' {
			digits++
		}
		n, err := strconv.Atoi(rewritten[j+1 : digits])
		if err != nil || n < 1 || n > len(names) {
			return nil, fmt.Errorf("cannot read its parameters at byte %d", i)
		}
		names[n-1] = stmt[i+1 : end]
		i, j = end, digits
	}
	for _, n := range names {
		if n == "" {
			return nil, errors.New("cannot read its parameters")
		}
	}
	return names, nil
}

func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_'
}

// checkParams checks that every parameter the statement binds is one of
// toolq's or a top-level property of schema, and not both.
func (s *SQL) checkParams(schema json.RawMessage) error {
	var sch struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(schema, &sch); err != nil {
		return fmt.Errorf("the schema is not an object: %v", err)
	}
	for _, p := range s.params {
		_, declared := sch.Properties[p]
		switch own := slices.Contains(toolqParams, p); {
		case own && declared:
			return fmt.Errorf("@%s is toolq's, and the schema declares an args member %q too: rename the member", p, p)
		case !own && !declared:
			return fmt.Errorf("@%s is neither a property the schema declares at its top level nor one of toolq's (@%s)", p, strings.Join(toolqParams, ", @"))
		}
	}
	return nil
}

// ExecuteTx runs the statement in tx with the call's parameters, and
// answers its output. It runs with the extended protocol whatever the
// connection's default_query_exec_mode, so that Postgres runs one
// statement, and checks that it ran one of the kinds Statement lists. An
// error of Postgres's is classified by its SQLSTATE (see sqlError).
func (s *SQL) ExecuteTx(ctx context.Context, tx pgx.Tx, req Request) (json.RawMessage, error) {
	args, err := s.bind(req)
	if err != nil {
		return nil, err
	}
	// QueryExecModeExec: the extended protocol, unprepared, every parameter
	// text of a type Postgres infers, and every column read as text.
	rows, err := tx.Query(ctx, s.Statement, pgx.QueryExecModeExec, args)
	if err != nil {
		return nil, sqlError(err)
	}
	defer rows.Close()
	var out bytes.Buffer
	n := 0
	out.WriteByte('[')
	for rows.Next() {
		n++
		if s.Output == SQLAffected {
			continue // the rows of an UPDATE … RETURNING: the tag counts them
		}
		if n > 1 {
			out.WriteByte(',')
		}
		if err := writeRow(&out, rows.FieldDescriptions(), rows.RawValues()); err != nil {
			return nil, err
		}
		if int64(out.Len()) > s.MaxOutputBytes {
			return nil, DefiniteError("output_too_large", fmt.Sprintf("the statement's output exceeds %d bytes", s.MaxOutputBytes))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, sqlError(err)
	}
	tag := rows.CommandTag()
	if kind, _, _ := strings.Cut(tag.String(), " "); !slices.Contains(sqlTags, kind) {
		return nil, DefiniteError("unexpected_statement", fmt.Sprintf("the statement ran as %q, not one of the kinds a sql executor runs", tag.String()))
	}
	out.WriteByte(']')
	switch {
	case s.Output == SQLAffected:
		return fmt.Appendf(nil, `{"rows_affected":%d}`, tag.RowsAffected()), nil
	case s.Output == SQLRows:
		return out.Bytes(), nil
	case n == 0:
		return nil, DefiniteError("no_row", "the statement returned no row")
	case n == 1:
		return bytes.TrimSuffix(bytes.TrimPrefix(out.Bytes(), []byte("[")), []byte("]")), nil
	default:
		return nil, DefiniteError("more_than_one_row", fmt.Sprintf("the statement returned %d rows, not one", n))
	}
}

// sqlTags are the command tags of the statements sqlKinds name (WITH and
// VALUES run as one of these).
var sqlTags = []string{"SELECT", "INSERT", "UPDATE", "DELETE", "MERGE", "CALL"}

// CheckArgs refuses args that the statement would not bind as they are
// written: a number, in a member it binds (at any depth), whose value is
// not that of the double it reads as. The worker binds the call's
// canonical args (RFC 8785), whose numbers are doubles written as briefly
// as they read back: 1.000000000000000001 would be bound as 1. Such a
// number can be sent as a string, which Postgres reads exactly as the
// parameter's type (numeric among them).
func (s *SQL) CheckArgs(args json.RawMessage) error {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(args, &members); err != nil {
		return fmt.Errorf("the args are not a JSON object: %v", err)
	}
	for _, p := range s.params {
		v, ok := members[p]
		if !ok || slices.Contains(toolqParams, p) {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(v))
		dec.UseNumber()
		for {
			tok, err := dec.Token()
			if err != nil {
				break // io.EOF: the args were checked as JSON before
			}
			if n, ok := tok.(json.Number); ok {
				if canonical, exact := asDouble(string(n)); !exact {
					return fmt.Errorf("@%s: the number %s would be bound as %s, the double it reads as: send it as a string to bind it as written", p, n, canonical)
				}
			}
		}
	}
	return nil
}

// asDouble is the number literal lit as its canonical form writes it (the
// shortest decimal that reads back as the same double), and whether that
// is the same value.
func asDouble(lit string) (string, bool) {
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil {
		return lit, false
	}
	canonical := strconv.FormatFloat(f, 'g', -1, 64)
	a, aok := decimalOf(lit)
	b, bok := decimalOf(canonical)
	return canonical, aok && bok && a == b
}

// decimalOf writes a JSON number literal in one form per value: its
// significant digits and exponent ("-15e-1" for -1.50), "0" for zero.
// ok is false for an exponent beyond ±2^31.
func decimalOf(lit string) (string, bool) {
	sign := ""
	if rest, neg := strings.CutPrefix(lit, "-"); neg {
		sign, lit = "-", rest
	}
	mantissa, exponent, _ := strings.Cut(strings.ToLower(lit), "e")
	whole, frac, _ := strings.Cut(mantissa, ".")
	digits := strings.TrimLeft(whole+frac, "0")
	if digits == "" {
		return "0", true
	}
	exp := int64(0)
	if exponent != "" {
		var err error
		if exp, err = strconv.ParseInt(exponent, 10, 32); err != nil {
			return "", false
		}
	}
	significant := strings.TrimRight(digits, "0")
	exp += int64(len(digits)-len(significant)) - int64(len(frac))
	return sign + significant + "e" + strconv.FormatInt(exp, 10), true
}

// bind names the statement's parameters' values: toolq's from req, the
// others from the args' top-level members, each as text (see SQL).
func (s *SQL) bind(req Request) (pgx.NamedArgs, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(req.Args, &members); err != nil {
		return nil, DefiniteError("invalid_args", fmt.Sprintf("the args are not a JSON object: %v", err))
	}
	args := make(pgx.NamedArgs, len(s.params))
	for _, p := range s.params {
		switch p {
		case "key":
			args[p] = req.Key
		case "conversation_id":
			args[p] = req.ConversationID
		case "turn_index":
			args[p] = strconv.FormatInt(req.TurnIndex, 10)
		case "tool_use_id":
			args[p] = req.ToolUseID
		default:
			args[p] = textOf(members[p])
		}
	}
	return args, nil
}

// textOf is a JSON value as the text it is bound as: nil for null or
// absent, a string's value, any other value as written.
func textOf(v json.RawMessage) any {
	v = bytes.TrimSpace(v)
	switch {
	case len(v) == 0 || string(v) == "null":
		return nil
	case v[0] == '"':
		var s string
		if json.Unmarshal(v, &s) == nil {
			return s
		}
	}
	return string(v)
}

// writeRow writes one row, read in text format, as a JSON object by column
// name, in the columns' order.
func writeRow(out *bytes.Buffer, fields []pgconn.FieldDescription, values [][]byte) error {
	out.WriteByte('{')
	seen := make(map[string]bool, len(fields))
	for i, f := range fields {
		if seen[f.Name] {
			return DefiniteError("duplicate_column", fmt.Sprintf("the statement returns two columns named %q: name them apart with AS", f.Name))
		}
		seen[f.Name] = true
		if i > 0 {
			out.WriteByte(',')
		}
		name, _ := json.Marshal(f.Name)
		out.Write(name)
		out.WriteByte(':')
		writeValue(out, f.DataTypeOID, values[i])
	}
	out.WriteByte('}')
	return nil
}

// writeValue writes a column's text as JSON (see SQL.Output).
func writeValue(out *bytes.Buffer, oid uint32, text []byte) {
	switch {
	case text == nil:
		out.WriteString("null")
		return
	case oid == pgtype.BoolOID:
		out.WriteString(strconv.FormatBool(string(text) == "t"))
		return
	case oid == pgtype.JSONOID || oid == pgtype.JSONBOID:
		if json.Valid(text) {
			out.Write(text)
			return
		}
	case numeric(oid) && json.Valid(text) && (text[0] == '-' || text[0] >= '0' && text[0] <= '9'):
		out.Write(text) // NaN and Infinity are not JSON numbers: strings below
		return
	}
	s, _ := json.Marshal(strings.ToValidUTF8(string(text), "\uFFFD"))
	out.Write(s)
}

func numeric(oid uint32) bool {
	switch oid {
	case pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID, pgtype.OIDOID, pgtype.Float4OID, pgtype.Float8OID, pgtype.NumericOID:
		return true
	}
	return false
}

// sqlError classifies an error of a transactional tool's statement by its
// SQLSTATE (sqlRetried): one the database's state at the time caused is
// not sent (the transaction rolled back, and the call runs again); any
// other is the statement's own, for its text or its data, which would fail
// the same way again: a definite failure. Both have code sqlstate_<code>.
// An error that is not Postgres's is returned as it is.
func sqlError(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err // a context's error, or the connection's: Classify reads it
	}
	msg := pgErr.Message
	if pgErr.Detail != "" {
		msg += ": " + pgErr.Detail
	}
	msg += " (SQLSTATE " + pgErr.Code + ")"
	code := "sqlstate_" + pgErr.Code
	if _, retried := sqlRetry(pgErr.Code); retried {
		return NotSentError(code, msg+"; the transaction rolled back", 0, err)
	}
	return DefiniteError(code, msg)
}

// sqlRetried are the SQLSTATEs, by class or by code, that the database's
// state causes rather than the statement: true for contention between
// transactions, which a retry goes through and which says nothing of the
// database's health (the circuit breaker does not count it), false for an
// unavailable or unwell database.
var sqlRetried = map[string]bool{
	"08":    false, // connection exception
	"25006": false, // read_only_sql_transaction: a primary demoted by a failover
	"25P03": false, // idle_in_transaction_session_timeout
	"25P04": false, // transaction_timeout
	"40":    true,  // transaction rollback: serialization failure, deadlock
	"53":    false, // insufficient resources: disk full, out of memory, too many connections
	"55P03": true,  // lock_not_available: lock_timeout, NOWAIT
	"57":    false, // operator intervention: query_canceled (statement_timeout), shutdowns
	"58":    false, // system error: I/O error
	"72":    false, // snapshot_too_old
	"XX":    false, // internal error: data or index corrupted
}

// sqlRetry reports whether SQLSTATE code is one of sqlRetried, and
// whether it is contention.
func sqlRetry(code string) (contention, retried bool) {
	if c, ok := sqlRetried[code]; ok {
		return c, true
	}
	c, ok := sqlRetried[code[:min(2, len(code))]]
	return c, ok
}

// sqlContention reports whether an error's code is a transaction conflict
// (see sqlRetried), which the circuit breaker does not count.
func sqlContention(code string) bool {
	state, ok := strings.CutPrefix(code, "sqlstate_")
	if !ok {
		return false
	}
	contention, retried := sqlRetry(state)
	return contention && retried
}
