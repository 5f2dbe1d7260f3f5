package tools_test

import (
	"fmt"
	"strings"

	"github.com/toolq/toolq/tools"
)

// A transactional_write whose effect is one statement in the ledger's
// database: its parameters are named, and each must be a member the schema
// declares or one of toolq's own (@key here).
func ExampleSQLExecutor() {
	const registry = `tools:
  - name: record_refund
    class: transactional_write
    schema: {type: object, properties: {order_id: {type: string}, amount_cents: {type: integer}}}
    sql:
      statement: INSERT INTO refunds (order_id, amount_cents, idempotency_key) VALUES (@order_id, @amount_cents, @key) RETURNING id
      output: row
`
	reg, err := tools.Parse([]byte(registry), "tools.yaml", tools.Config{})
	if err != nil {
		panic(err)
	}
	tool, _ := reg.Lookup("record_refund")
	fmt.Println(tool.Class, tool.UsesLedger, tool.Audit().CanDoubleFire)

	_, err = tools.Parse([]byte(strings.Replace(registry, "@amount_cents", "@amount", 1)), "tools.yaml", tools.Config{})
	fmt.Println(err)
	// Output:
	// transactional_write true false
	// tools.yaml: tool "record_refund": sql.statement: @amount is neither a property the schema declares at its top level nor one of toolq's (@key, @conversation_id, @turn_index, @tool_use_id)
}
