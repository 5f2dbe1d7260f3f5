// @toolq/client: the agent's side of toolq for Node. callKey derives a tool
// call's idempotency key exactly as the Go side does; Client publishes calls
// as jobs and awaits their results over NATS JetStream; streamTurn wires it
// to a streaming model response.
export * from "./key.js";
export * from "./client.js";
export * from "./stream.js";
