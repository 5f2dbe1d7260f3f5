// An agent's MCP client on toolq's front door, with the official TypeScript
// SDK: a payment whose response stream is cut (the Go test's proxy cuts the
// first tools/call), re-issued as the specification says (a new request,
// with a new ID), then once more on a new connection; and a write sent
// without the _meta that names it. Prints what it saw as one JSON object.
//
//   node frontdoor-client.mjs URL INVOICE CONVERSATION TURN
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, invoice, conversation, turn] = process.argv.slice(2);

async function connect() {
  const client = new Client({ name: "toolq-frontdoor-test", version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(new URL(url)));
  return client;
}

const payment = {
  name: "send_payment",
  arguments: { invoice_id: invoice, amount_cents: 500, currency: "EUR" },
  _meta: { "io.toolq/conversation_id": conversation, "io.toolq/turn_index": Number(turn) },
};

const seen = {};
const client = await connect();
try {
  seen.cut = await client.callTool(payment);
} catch (err) {
  seen.cutError = String(err?.message ?? err);
}
// The stream broke: the request is lost, and the client sends it again.
seen.reissued = await client.callTool(payment);
const other = await connect();
seen.again = await other.callTool(payment);
try {
  seen.unnamed = await other.callTool({ name: "send_payment", arguments: payment.arguments });
} catch (err) {
  seen.refusal = { code: err?.code, message: String(err?.message ?? err) };
}
await client.close();
await other.close();
console.log(JSON.stringify(seen));
