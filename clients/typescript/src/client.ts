// The agent's side of toolq: publish each completed tool call as a job and
// await the result addressed to its tool_use_id, with the subjects, headers
// and bodies of the Go client (jobs.Client).

import { headers, type MsgHdrs, type NatsConnection } from "@nats-io/nats-core";
import type * as OTel from "@opentelemetry/api";
import { DeliverPolicy, jetstream, jetstreamManager, type JetStreamClient } from "@nats-io/jetstream";
import { canonicalizeArgs, callMaterial, keyOf, KeyError, TOOL_USE_ID_PATTERN, validTenant, TENANT_PATTERN, RESERVED_TENANTS, type Args } from "./key.js";

export const JOBS_STREAM = "TOOLQ_JOBS";
export const RESULTS_STREAM = "TOOLQ_RESULTS";
export const HEADER_KEY = "Toolq-Key";
export const HEADER_MSG_ID = "Nats-Msg-Id";
export const HEADER_TRACEPARENT = "traceparent";
/** The subject of the consumers' ledger lookup (a NATS micro service, toolq-ledger). */
export const LOOKUP_SUBJECT = "toolq.ledger.get";

/** What the ledger knows of a key. */
export interface Lookup {
  key: string;
  /**
   * "unknown" (no row: never ran, or purged), "in_flight", "completed",
   * "failed", "indeterminate", or "awaiting_approval" (the call waits for a
   * person's decision and has not run; approval says what is asked).
   */
  state: "unknown" | "in_flight" | "completed" | "failed" | "indeterminate" | "awaiting_approval" | "approved";
  attempt?: number;
  first_tool_use_id?: string;
  /** The output of a completed call. */
  output?: unknown;
  error?: { code: string; message: string };
  lease_remaining_ms?: number;
  updated_at?: string;
  /** For a call whose tool asked a person: what was asked, and once decided, the decision (a denied or expired call is "failed"). */
  approval?: ResultApproval;
}

/** A lookup the service refused (a malformed key: 400; the ledger unreachable: 503). */
export class LookupError extends Error {
  constructor(
    readonly code: string,
    readonly description: string,
  ) {
    super(`toolq: lookup refused: ${code} ${description}`);
    this.name = "LookupError";
  }
}
/** The subject of the consumers' tool list (a NATS micro service, toolq-tools). */
export const TOOLS_SUBJECT = "toolq.tools.list";

/** The APIs whose tool definitions the consumers answer with. */
export type ToolFormat = "anthropic" | "openai" | "openai-responses" | "mcp";

/** A JSON Schema whose top level is an object schema, as every format's input schema is. */
export type ObjectSchema = { type: "object"; [member: string]: unknown };

/** The tool definitions of each format: the registry's tools, in name order. */
export interface ToolDefinitions {
  /** The Messages API's tools. */
  anthropic: { name: string; description?: string; input_schema: ObjectSchema }[];
  /** Chat Completions' tools. */
  openai: { type: "function"; function: { name: string; description?: string; parameters: ObjectSchema } }[];
  /** The Responses API's function tools (strict mode off: the consumer checks args against the whole schema). */
  "openai-responses": { type: "function"; name: string; description?: string; parameters: ObjectSchema; strict: false }[];
  /** MCP Tool objects, as a tools/list result's tools. A write is never idempotentHint: a second call is another call. */
  mcp: { name: string; description?: string; inputSchema: ObjectSchema; annotations: { readOnlyHint: boolean; idempotentHint?: boolean } }[];
}

/** A tool list the service refused (an unknown format: 400; a tool whose schema no API takes: 500). */
export class ToolsError extends Error {
  constructor(
    readonly code: string,
    readonly description: string,
  ) {
    super(`toolq: tool list refused: ${code} ${description}`);
    this.name = "ToolsError";
  }
}

/** The only version of the job and result bodies this client writes and reads. */
export const VERSION = 1;

export const jobSubject = (tool: string) => `toolq.jobs.${tool}`;
export const resultSubject = (conversationId: string) => `toolq.results.${conversationId}`;
/** The prefix of a tenant's subjects (docs/tenants.md): "toolq." for the default tenant "", "toolq.<tenant>." for another. */
const tenantPrefix = (tenant: string) => (tenant === "" ? "toolq." : `toolq.${tenant}.`);
export const tenantJobSubject = (tenant: string, tool: string) => `${tenantPrefix(tenant)}jobs.${tool}`;
export const tenantResultSubject = (tenant: string, conversationId: string) => `${tenantPrefix(tenant)}results.${conversationId}`;
export const tenantLookupSubject = (tenant: string) => `${tenantPrefix(tenant)}ledger.get`;
/** A tenant's stream of a kind (RESULTS_STREAM, "TOOLQ_DLQ", "TOOLQ_APPROVALS"): TOOLQ_<tenant>_RESULTS…; the default tenant's is the stream itself. */
export const tenantStream = (tenant: string, stream: string) => (tenant === "" || stream === JOBS_STREAM ? stream : `TOOLQ_${tenant}_${stream.slice("TOOLQ_".length)}`);
export const jobMsgId = (key: string, toolUseId: string) => `job:${key}:${toolUseId}`;

/** One completed tool call of an assistant turn. */
export interface Job {
  conversationId: string;
  turnIndex: number;
  /** Position among identical calls (same tool, same canonical args) of the turn; default 0. */
  ordinal?: number;
  tool: string;
  /** The model's id for this attempt's block; new on every attempt of the turn. */
  toolUseId: string;
  /** The JSON text of the arguments (exact), or a plain object (see Args). */
  args: Args;
}

export interface PublishOptions {
  /**
   * The W3C traceparent of the caller's span, for an application without
   * OpenTelemetry: the job carries it, so the consumer's spans join the
   * caller's trace. With `@opentelemetry/api` installed and an SDK
   * registered, the client starts a real `send toolq.jobs.<tool>` producer
   * span instead, under the active context (or under this traceparent when
   * given), and the job carries that span's context.
   */
  traceparent?: string;
}

export interface Published {
  key: string;
  stream: string;
  seq: number;
  /** JetStream dropped it as an exact re-publication (same key and tool_use_id). */
  duplicate: boolean;
}

/**
 * A result's status. Every status is final but "awaiting_approval": the
 * call waits for a person's decision and has not run, and its final result
 * ("ok", "error", …, or "denied" / "expired": it never ran) follows for the
 * same tool_use_id.
 */
export type Status = "ok" | "error" | "rejected" | "indeterminate" | "awaiting_approval" | "denied" | "expired";

/** Whether a result with this status is the call's last word: every status but "awaiting_approval". */
export const isFinal = (status: Status): boolean => status !== "awaiting_approval";

/**
 * Whether next, read after prev (undefined: none) for the same tool_use_id,
 * answers the call instead: a later answer supersedes an earlier one,
 * except that a pending one never supersedes a final one (a pending answer
 * that a decision overtook).
 */
export const supersedes = (prev: Result | undefined, next: Result): boolean => !prev || isFinal(next.status) || !isFinal(prev.status);

/** What a result says of the approval of a call that needed a person's. */
export interface ResultApproval {
  /** The canonical args (RFC 8785) that run if approved. */
  args: unknown;
  args_digest: string;
  /** The approver group that decides. */
  group: string;
  requested_at: string;
  expires_at: string;
  /** Once decided: "approved", "denied" or "expired", by whom, why, when. */
  decision?: "approved" | "denied" | "expired";
  decided_by?: string;
  reason?: string;
  decided_at?: string;
}

/** The body of a message on toolq.results.<conversation_id>. */
export interface Result {
  version: number;
  key: string;
  conversation_id: string;
  turn_index: number;
  ordinal: number;
  tool: string;
  tool_use_id: string;
  status: Status;
  output?: unknown;
  error?: { code: string; message: string };
  duplicate: boolean;
  original_tool_use_id?: string;
  attempts: number;
  completed_at: string;
  /** Set on the results of a call that needed a person's approval. */
  approval?: ResultApproval;
  /** The job's tenant; absent for the default tenant. */
  tenant?: string;
}

/** A tool_use block of a completed assistant turn. */
export interface ToolCall {
  toolUseId: string;
  tool: string;
  args: Args;
}

/** The tool_result entry to append to the turn for one call, in the Messages API's shape. */
export interface ToolResult {
  type: "tool_result";
  tool_use_id: string;
  /**
   * The output as JSON text; for a call awaiting approval, text that says
   * so (approvalText); for a call that did not succeed, an error object the
   * model can read.
   */
  content: string;
  is_error?: boolean;
}

export interface AwaitOptions {
  /** Stops the wait; the promise then rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Read the conversation's results from this stream sequence (default: from the start). */
  fromSeq?: number;
  /**
   * Wait for each call's final result, past one awaiting a person's
   * approval (which may take hours). Default false: the first result, a
   * pending one included, so that the agent is never held up by a person.
   */
  final?: boolean;
}

/** Client publishes jobs and awaits their results. The streams must exist (the consumer creates them). */
export class Client {
  readonly js: JetStreamClient;

  /**
   * A tenant's client (docs/tenants.md) publishes on toolq.<tenant>.jobs.<tool>
   * with the tenant in the key's material and the body, awaits results in
   * TOOLQ_<tenant>_RESULTS, looks keys up on toolq.<tenant>.ledger.get, and
   * drops any result that is not its tenant's; connect with the tenant's
   * inbox prefix (inboxPrefix: "_INBOX_<tenant>"). Default "": the default
   * tenant, today's subjects and keys.
   */
  readonly tenant: string;

  constructor(readonly nc: NatsConnection, opts: { tenant?: string } = {}) {
    this.js = jetstream(nc);
    this.tenant = opts.tenant ?? "";
    if (!validTenant(this.tenant)) {
      throw new KeyError("field", "tenant", `must match ${TENANT_PATTERN.source} and not be ${RESERVED_TENANTS.join(", ")}`);
    }
  }

  /** Starts a reader of the results published from now on (filter: toolq.results.> by default; a tenant's: toolq.<tenant>.results.>). */
  results(filter = `${tenantPrefix(this.tenant)}results.>`): Promise<ResultsReader> {
    return ResultsReader.start(this, filter);
  }

  /** The client bound to one conversation. */
  conversation(conversationId: string): Conversation {
    return new Conversation(this, conversationId);
  }

  /**
   * Validates the job, derives its key and publishes it on toolq.jobs.<tool>
   * with the Toolq-Key header, the Nats-Msg-Id job:<key>:<tool_use_id> and
   * a W3C traceparent. Throws a KeyError for an invalid job, or the publish
   * error.
   */
  async publish(job: Job, opts: PublishOptions = {}): Promise<Published> {
    if (typeof job.toolUseId !== "string" || !TOOL_USE_ID_PATTERN.test(job.toolUseId)) {
      throw new KeyError("field", "tool_use_id", `must match ${TOOL_USE_ID_PATTERN.source}`);
    }
    const m = callMaterial({ ...job, tenant: this.tenant });
    const key = keyOf(m);
    const tenant = this.tenant === "" ? "" : `"tenant":${JSON.stringify(this.tenant)},`;
    const body =
      `{"version":${VERSION},${tenant}"conversation_id":${JSON.stringify(job.conversationId)},"turn_index":${job.turnIndex},` +
      `"ordinal":${job.ordinal ?? 0},"tool":${JSON.stringify(job.tool)},"tool_use_id":${JSON.stringify(job.toolUseId)},` +
      `"args":${m.canonical},"created_at":${JSON.stringify(new Date().toISOString())}}`;
    const subject = tenantJobSubject(this.tenant, job.tool);
    const h = headers();
    h.set(HEADER_KEY, key);
    const send = () =>
      this.js.publish(subject, body, { msgID: jobMsgId(key, job.toolUseId), headers: h, expect: { streamName: JOBS_STREAM } });
    const ack = await traced(subject, key, job.toolUseId, h, opts.traceparent, send);
    return { key, stream: ack.stream, seq: ack.seq, duplicate: ack.duplicate };
  }

  /**
   * Waits for the result addressed to toolUseId in the conversation, one
   * published before the call included: the latest, a final one over one
   * awaiting approval. A call awaiting approval is returned as such unless
   * opts.final.
   */
  async awaitResult(conversationId: string, toolUseId: string, opts: AwaitOptions = {}): Promise<Result> {
    const got = await this.awaitResults(conversationId, [toolUseId], opts);
    return got.get(toolUseId)!;
  }

  /**
   * What the ledger knows of a key (the consumers' lookup service, on
   * toolq.ledger.get): did this call already happen, and how did it end?
   * Does it still await a person's approval (state "awaiting_approval")?
   * Throws a LookupError when the service refuses the request.
   */
  async lookup(key: string, opts: { timeoutMs?: number } = {}): Promise<Lookup> {
    const msg = await this.nc.request(tenantLookupSubject(this.tenant), key, { timeout: opts.timeoutMs ?? 5000 });
    const code = msg.headers?.get("Nats-Service-Error-Code");
    if (code) throw new LookupError(code, msg.headers?.get("Nats-Service-Error") ?? "");
    return msg.json<Lookup>();
  }

  /**
   * The consumers' registry as the tool definitions of format (the tool
   * list service, on toolq.tools.list), to hand the model as they are, so
   * that the agent's tool list is the registry's. Consumers that run
   * different registries each answer with their own. Throws a ToolsError
   * when the service refuses the request, and NATS's RequestError when no
   * consumer answers (isNoResponders()) or none in time.
   */
  async tools<F extends ToolFormat>(format: F, opts: { timeoutMs?: number } = {}): Promise<ToolDefinitions[F]> {
    const msg = await this.nc.request(TOOLS_SUBJECT, JSON.stringify({ format }), { timeout: opts.timeoutMs ?? 5000 });
    const code = msg.headers?.get("Nats-Service-Error-Code");
    if (code) throw new ToolsError(code, msg.headers?.get("Nats-Service-Error") ?? "");
    return msg.json<ToolDefinitions[F]>();
  }

  /** The sequence the next result will get: results of jobs published after this come at or after it. */
  async resultsCursor(): Promise<number> {
    const jsm = await jetstreamManager(this.nc);
    const info = await jsm.streams.info(tenantStream(this.tenant, RESULTS_STREAM));
    return info.state.last_seq + 1;
  }

  /**
   * Publishes the tool calls of one completed assistant turn and returns
   * their tool_result entries in the order of the calls. Identical calls
   * (same tool and canonical args) get ordinals 0, 1, … in order of
   * appearance. Results addressed to ids that are not in this turn (an
   * abandoned attempt's) are ignored. A call awaiting approval gets its
   * pending tool_result (not an error, see toToolResult) unless opts.final.
   */
  async runTurn(conversationId: string, turnIndex: number, calls: ToolCall[], opts: PublishOptions & AwaitOptions = {}): Promise<ToolResult[]> {
    let fromSeq = opts.fromSeq ?? (await this.resultsCursor());
    const seen = new Map<string, number>();
    for (const c of calls) {
      const identity = `${c.tool}|${canonicalizeArgs(c.args)}`;
      const ordinal = seen.get(identity) ?? 0;
      seen.set(identity, ordinal + 1);
      const pub = await this.publish({ conversationId, turnIndex, ordinal, tool: c.tool, toolUseId: c.toolUseId, args: c.args }, opts);
      // An exact re-publication was dropped: its result may be older than the cursor.
      if (pub.duplicate) fromSeq = 0;
    }
    const ids = calls.map((c) => c.toolUseId);
    const got = await this.awaitResults(conversationId, ids, { ...opts, fromSeq });
    return ids.map((id) => toToolResult(got.get(id)!));
  }

  /**
   * Reads the conversation's results until it has one for each of the
   * tool_use_ids and has read every result published before it started;
   * results addressed to other ids are skipped. A later answer to an id
   * supersedes an earlier one (the call run after an operator resolved it
   * as not run answers after its indeterminate; see supersedes). With
   * opts.final, it waits for a final result for each id.
   */
  async awaitResults(conversationId: string, toolUseIds: string[], opts: AwaitOptions = {}): Promise<Map<string, Result>> {
    const want = new Set(toolUseIds);
    const got = new Map<string, Result>();
    const enough = (r: Result | undefined) => r !== undefined && (!opts.final || isFinal(r.status));
    let done = 0; // ids whose result ends the wait
    opts.signal?.throwIfAborted();
    const from = opts.fromSeq ?? 0;
    const consumer = await this.js.consumers.get(tenantStream(this.tenant, RESULTS_STREAM), {
      filter_subjects: [tenantResultSubject(this.tenant, conversationId)],
      ...(from > 0 ? { deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: from } : { deliver_policy: DeliverPolicy.All }),
    });
    const messages = await consumer.consume();
    const onAbort = () => messages.stop();
    opts.signal?.addEventListener("abort", onAbort, { once: true });
    try {
      for await (const m of messages) {
        let r: Result;
        try {
          r = m.json<Result>();
        } catch {
          continue;
        }
        if ((r.tenant ?? "") !== this.tenant) continue; // another tenant's result is never this client's
        const prev = got.get(r.tool_use_id);
        if (want.has(r.tool_use_id) && supersedes(prev, r)) {
          if (!enough(prev) && enough(r)) done++;
          got.set(r.tool_use_id, r);
        }
        if (done === want.size && m.info.pending === 0) break;
      }
    } finally {
      opts.signal?.removeEventListener("abort", onAbort);
      messages.stop();
    }
    opts.signal?.throwIfAborted();
    if (done < want.size) throw new Error(`toolq: results of ${conversationId}: the subscription ended before every result came`);
    return got;
  }
}

/**
 * ResultsReader reads the results stream through one ordered consumer and
 * hands each result to whoever expects its tool_use_id; a result nobody
 * expects (an abandoned attempt's, another agent's) is dropped at once. An
 * agent that plays many turns holds one consumer and only the ids it awaits
 * (awaitResult creates a consumer for each call). Start it with
 * Client.results(), expect an id before publishing its job. An id stays
 * expected until its final result came or cancel(): past a result awaiting
 * approval, its final result is kept too.
 */
export class ResultsReader {
  private readonly waiting = new Map<string, Slot>(); // by slotKey
  private stopped?: Error;

  private constructor(
    private readonly messages: { stop(): void } & AsyncIterable<{ json<T>(): T }>,
    private readonly tenant: string,
  ) {}

  /** @internal */
  static async start(client: Client, filter: string): Promise<ResultsReader> {
    // From the stream's next sequence, not "new": an ordered consumer
    // recreated before it delivered anything (its server died) starts
    // again from where this one did, and misses no result published
    // meanwhile.
    const from = await client.resultsCursor();
    const consumer = await client.js.consumers.get(tenantStream(client.tenant, RESULTS_STREAM), {
      filter_subjects: [filter],
      deliver_policy: DeliverPolicy.StartSequence,
      opt_start_seq: from,
    });
    const reader = new ResultsReader(await consumer.consume(), client.tenant);
    void reader.read();
    return reader;
  }

  private async read(): Promise<void> {
    let err = new Error("toolq: results reader closed");
    try {
      for await (const m of this.messages) {
        let r: Result;
        try {
          r = m.json<Result>();
        } catch {
          continue;
        }
        if ((r.tenant ?? "") !== this.tenant) continue; // another tenant's result is never this reader's
        // The id expected in the result's conversation, else in any.
        let k = slotKey(r.conversation_id, r.tool_use_id);
        if (!this.waiting.has(k)) k = slotKey("", r.tool_use_id);
        const slot = this.waiting.get(k);
        if (!slot) continue;
        if (supersedes(slot.result, r)) slot.result = r;
        if (isFinal(r.status)) this.waiting.delete(k); // nothing follows a final result
        for (const notify of [...slot.listeners]) notify();
      }
    } catch (e) {
      err = e instanceof Error ? e : new Error(String(e));
    }
    this.stopped = err;
    for (const slot of this.waiting.values()) for (const notify of [...slot.listeners]) notify();
    this.waiting.clear();
  }

  /**
   * Starts keeping the results addressed to the ids; call before publishing
   * their jobs. Give the conversation (opts.conversationId) when the reader
   * reads more than one: a tool_use_id may recur in another conversation (a
   * framework that numbers its calls, a replayed model response), whose
   * result must not answer this one. Without it, the id's result in any
   * conversation the reader reads is taken.
   */
  expect(toolUseIds: string[], opts: { conversationId?: string } = {}): Expected {
    const keys = toolUseIds.map((id) => slotKey(opts.conversationId ?? "", id));
    const slots = keys.map((k) => {
      const slot: Slot = { listeners: new Set() };
      if (!this.stopped) this.waiting.set(k, slot);
      return slot;
    });
    const cancel = () =>
      keys.forEach((k, i) => {
        if (this.waiting.get(k) === slots[i]) this.waiting.delete(k);
      });
    return {
      cancel,
      wait: (opts?: AbortSignal | WaitOptions) => {
        const { signal, final } = opts instanceof AbortSignal ? { signal: opts, final: false } : (opts ?? {});
        return Promise.all(slots.map((slot) => this.until(slot, final ?? false, signal)));
      },
    };
  }

  /** The slot's result once it is enough: any, or with final a final one. */
  private until(slot: Slot, final: boolean, signal?: AbortSignal): Promise<Result> {
    return new Promise<Result>((resolve, reject) => {
      const settle = () => {
        const r = slot.result;
        if (r && (!final || isFinal(r.status))) resolve(r);
        else if (this.stopped) reject(this.stopped);
        else return;
        slot.listeners.delete(settle);
        signal?.removeEventListener("abort", onAbort);
      };
      const onAbort = () => {
        slot.listeners.delete(settle);
        reject(signal!.reason);
      };
      if (signal?.aborted) return reject(signal.reason);
      slot.listeners.add(settle);
      signal?.addEventListener("abort", onAbort, { once: true });
      settle();
    });
  }

  /** Stops the reader; waits still pending reject. */
  close(): void {
    this.messages.stop();
  }
}

/** The key of an expected id: its conversation ("" for any) and the id. */
function slotKey(conversationId: string, toolUseId: string): string {
  return `${conversationId}\n${toolUseId}`;
}

/** The latest result of an expected id, and the waits to tell when it changes. */
interface Slot {
  result?: Result;
  listeners: Set<() => void>;
}

export interface WaitOptions {
  /** Stops the wait; the promise then rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Wait for each id's final result, past one awaiting approval (default: the first result). */
  final?: boolean;
}

/**
 * Results kept for a set of ids: wait() gives them in the order of the ids
 * (the latest of each that came; with final, each id's final result), and
 * may be called again, with final, after it gave a result awaiting
 * approval; cancel() drops them.
 */
export interface Expected {
  wait(opts?: AbortSignal | WaitOptions): Promise<Result[]>;
  cancel(): void;
}

/** A Client bound to one conversation: publish, awaitResult(toolUseId) and runTurn(turnIndex, calls). */
export class Conversation {
  constructor(
    readonly client: Client,
    readonly id: string,
  ) {}

  publish(job: Omit<Job, "conversationId">, opts?: PublishOptions): Promise<Published> {
    return this.client.publish({ ...job, conversationId: this.id }, opts);
  }

  awaitResult(toolUseId: string, opts?: AwaitOptions): Promise<Result> {
    return this.client.awaitResult(this.id, toolUseId, opts);
  }

  runTurn(turnIndex: number, calls: ToolCall[], opts?: PublishOptions & AwaitOptions): Promise<ToolResult[]> {
    return this.client.runTurn(this.id, turnIndex, calls, opts);
  }
}

/**
 * The tool_result entry for a result: its output for ok; for a call
 * awaiting approval, not an error but text that says so (approvalText);
 * else an error object the model can read, {"status", "error": {"code",
 * "message"}}, whose message for a denied or expired call is its
 * approvalText. The Go and Python clients give the same.
 */
export function toToolResult(r: Result): ToolResult {
  if (r.status === "ok") {
    return { type: "tool_result", tool_use_id: r.tool_use_id, content: JSON.stringify(r.output ?? null) };
  }
  if (r.status === "awaiting_approval") {
    return { type: "tool_result", tool_use_id: r.tool_use_id, content: approvalText(r) };
  }
  const error = { code: r.error?.code ?? r.status, message: approvalText(r) || (r.error?.message ?? "") };
  return { type: "tool_result", tool_use_id: r.tool_use_id, content: JSON.stringify({ status: r.status, error }), is_error: true };
}

/**
 * What the model reads of a call that a person had to approve and that has
 * not run: for one awaiting approval "awaiting approval by a person (key …,
 * expires …); the call has not run", for a denied one "denied by NAME:
 * REASON; the call did not run", for an expired one that no person decided
 * in time. "" for the other statuses.
 */
export function approvalText(r: Result): string {
  const a = r.approval;
  const expires = a?.expires_at ? rfc3339(a.expires_at) : "";
  switch (r.status) {
    case "awaiting_approval":
      return `awaiting approval by a person (key ${r.key}${expires ? `, expires ${expires}` : ""}); the call has not run`;
    case "denied":
      return `denied by ${a?.decided_by || "a person"}${a?.reason ? `: ${a.reason}` : ""}; the call did not run`;
    case "expired":
      return expires
        ? `expired: no person decided before ${expires}; the call did not run`
        : "expired: no person decided in time; the call did not run";
    default:
      return "";
  }
}

/** A timestamp in UTC to the second, as Go's time.RFC3339 writes it. */
function rfc3339(t: string): string {
  const d = new Date(t);
  return Number.isNaN(d.getTime()) ? t : d.toISOString().replace(/\.\d{3}Z$/, "Z");
}

const TRACEPARENT = /^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$/;

// The application's OpenTelemetry API, when it has one (an optional peer
// dependency): undefined when it is not installed.
let otelAPI: Promise<typeof OTel | undefined> | undefined;
const otel = () => (otelAPI ??= import("@opentelemetry/api").catch(() => undefined));

/** The span context a valid traceparent names. */
function spanContextOf(traceparent: string): OTel.SpanContext {
  const [, traceId, spanId, flags] = traceparent.split("-");
  return { traceId, spanId, traceFlags: parseInt(flags, 16), isRemote: true };
}

/**
 * Runs send with the job's trace context in h. With OpenTelemetry, under a
 * producer span of its own, a child of the active context (or of
 * traceparent); without, the caller's traceparent as given, when valid. No
 * span is invented that no backend would receive.
 */
async function traced<T>(subject: string, key: string, toolUseId: string, h: MsgHdrs, traceparent: string | undefined, send: () => Promise<T>): Promise<T> {
  const given = traceparent !== undefined && TRACEPARENT.test(traceparent) ? traceparent : undefined;
  const api = await otel();
  if (!api) {
    if (given) h.set(HEADER_TRACEPARENT, given);
    return send();
  }
  const setter = { set: (carrier: MsgHdrs, k: string, v: string) => carrier.set(k, v) };
  // The caller's span as given is the parent whatever propagator is (or
  // is not) registered; else the active context.
  const parent = given ? api.trace.setSpanContext(api.context.active(), spanContextOf(given)) : api.context.active();
  const span = api.trace.getTracer("@toolq/client").startSpan(
    `send ${subject}`,
    {
      kind: api.SpanKind.PRODUCER,
      attributes: {
        "messaging.system": "nats",
        "messaging.destination.name": subject,
        "messaging.operation.type": "send",
        "toolq.key": key,
        "toolq.tool_use_id": toolUseId,
      },
    },
    parent,
  );
  try {
    try {
      api.propagation.inject(api.trace.setSpan(parent, span), h, setter);
    } catch (err) {
      span.recordException(err as Error); // tracing never stops a publish
    }
    const sc = span.spanContext();
    if (!h.has(HEADER_TRACEPARENT) && api.isSpanContextValid(sc)) {
      // An SDK without a registered propagator: the context of the span
      // anyway, so that the consumer's spans join its trace.
      h.set(HEADER_TRACEPARENT, `00-${sc.traceId}-${sc.spanId}-0${sc.traceFlags & 1}`);
    } else if (!h.has(HEADER_TRACEPARENT) && given) {
      h.set(HEADER_TRACEPARENT, given); // no SDK: the caller's context as given
    }
    return await send();
  } catch (err) {
    span.recordException(err as Error);
    span.setStatus({ code: api.SpanStatusCode.ERROR, message: "publish failed" });
    throw err;
  } finally {
    span.end();
  }
}
