// Wiring toolq to a streaming model response, in the event shapes of the
// Anthropic Messages API (and its TypeScript SDK's stream): each tool_use
// block is dispatched the moment its content block stops, and a stream that
// fails is retried as a whole turn. The model then emits the same calls with
// new tool_use_ids; toolq runs each call once and answers every id.
//
// The types below are the few fields used here, so that no SDK is needed.

import { toToolResult, type Client, type Expected, type Result, type ResultsReader, type ToolResult } from "./client.js";
import { canonicalizeArgs } from "./key.js";

export type StreamEvent =
  | { type: "message_start"; message?: unknown }
  | { type: "content_block_start"; index: number; content_block: ContentBlockStart }
  | { type: "content_block_delta"; index: number; delta: BlockDelta }
  | { type: "content_block_stop"; index: number }
  | { type: "message_delta"; delta?: { stop_reason?: string | null }; usage?: unknown }
  | { type: "message_stop" }
  | { type: "ping" }
  | { type: "error"; error: { type: string; message: string } };

export type ContentBlockStart =
  | { type: "text"; text: string }
  | { type: "tool_use"; id: string; name: string; input?: unknown }
  | { type: string; [k: string]: unknown };

export type BlockDelta =
  | { type: "text_delta"; text: string }
  | { type: "input_json_delta"; partial_json: string }
  | { type: string; [k: string]: unknown };

/** A block of the assistant turn as it is committed to the conversation. */
export type AssistantBlock = { type: "text"; text: string } | { type: "tool_use"; id: string; name: string; input: unknown };

/** The message recorded for a call whose stream was cut before its block completed. */
export const NOT_RUN = "not run (connection lost)";

/** What became of one attempt of the turn. */
export interface Attempt {
  /** The tool_use ids this attempt dispatched. */
  dispatched: string[];
  /** Calls whose blocks were cut by the failure: never sent to toolq. */
  notRun: { id: string; name: string; note: typeof NOT_RUN }[];
  /** Why it was abandoned; absent for the attempt that completed. */
  error?: string;
}

/** A turn whose stream completed, ready to append to the conversation. */
export interface StreamedTurn {
  /** The assistant message content of the completed attempt. */
  content: AssistantBlock[];
  /** One tool_result per tool_use block of content, in order. */
  toolResults: ToolResult[];
  /** Every attempt, the abandoned ones first. */
  attempts: Attempt[];
}

export interface StreamTurnOptions {
  client: Pick<Client, "publish" | "awaitResults" | "resultsCursor">;
  conversationId: string;
  turnIndex: number;
  /** Starts (again) the model's streamed response for this turn; attempt counts from 0. */
  stream: (attempt: number) => AsyncIterable<StreamEvent>;
  /**
   * Read the results through this reader (one consumer for every turn)
   * instead of a consumer for each turn; an abandoned attempt's ids are then
   * cancelled, and their results dropped.
   */
  results?: ResultsReader;
  /** Attempts before giving up (default 3). */
  maxAttempts?: number;
  signal?: AbortSignal;
  /**
   * Wait for each call's final result, past one awaiting a person's
   * approval. Default false: a call awaiting approval gets its pending
   * tool_result, and the turn completes.
   */
  final?: boolean;
}

/**
 * Plays the turn: streams the response, dispatches each tool_use block to
 * toolq when its content block stops, and on a stream error (an "error"
 * event, or the iterator throwing) abandons the attempt and streams the turn
 * again. The results addressed to an abandoned attempt's ids are never read.
 * Throws the last stream error after maxAttempts.
 */
export async function streamTurn(opts: StreamTurnOptions): Promise<StreamedTurn> {
  const attempts: Attempt[] = [];
  const max = opts.maxAttempts ?? 3;
  for (let n = 0; n < max; n++) {
    opts.signal?.throwIfAborted();
    const fromSeq = opts.results ? 0 : await opts.client.resultsCursor();
    const attempt: Attempt = { dispatched: [], notRun: [] };
    attempts.push(attempt);
    const blocks = new Map<number, { start: ContentBlockStart; text: string; done: boolean }>();
    const content: AssistantBlock[] = [];
    const ordinals = new Map<string, number>();
    const expected: Expected[] = [];
    let fresh = true; // no dispatch was dropped as an exact re-publication
    try {
      for await (const ev of opts.stream(n)) {
        if (ev.type === "error") throw new Error(`${ev.error.type}: ${ev.error.message}`);
        if (ev.type === "content_block_start") {
          blocks.set(ev.index, { start: ev.content_block, text: "", done: false });
        } else if (ev.type === "content_block_delta") {
          const b = blocks.get(ev.index);
          if (b && ev.delta.type === "input_json_delta") b.text += (ev.delta as { partial_json: string }).partial_json;
          if (b && ev.delta.type === "text_delta") b.text += (ev.delta as { text: string }).text;
        } else if (ev.type === "content_block_stop") {
          const b = blocks.get(ev.index);
          if (!b) continue;
          b.done = true;
          if (b.start.type === "text") content.push({ type: "text", text: b.text });
          if (b.start.type !== "tool_use") continue;
          const { id, name } = b.start as { id: string; name: string };
          const args = b.text === "" ? "{}" : b.text;
          const identity = `${name}|${canonicalizeArgs(args)}`;
          const ordinal = ordinals.get(identity) ?? 0;
          ordinals.set(identity, ordinal + 1);
          if (opts.results) expected.push(opts.results.expect([id], { conversationId: opts.conversationId }));
          // Dispatched now, while the rest of the response still streams.
          const pub = await opts.client.publish({ conversationId: opts.conversationId, turnIndex: opts.turnIndex, ordinal, tool: name, toolUseId: id, args });
          fresh &&= !pub.duplicate;
          attempt.dispatched.push(id);
          content.push({ type: "tool_use", id, name, input: JSON.parse(args) });
        } else if (ev.type === "message_stop") {
          break;
        }
      }
    } catch (err) {
      attempt.error = err instanceof Error ? err.message : String(err);
      for (const e of expected) e.cancel();
      for (const b of blocks.values()) {
        if (!b.done && b.start.type === "tool_use") {
          const { id, name } = b.start as { id: string; name: string };
          attempt.notRun.push({ id, name, note: NOT_RUN });
        }
      }
      continue;
    }
    let results: Result[];
    if (opts.results && fresh) {
      results = (await Promise.all(expected.map((e) => e.wait({ signal: opts.signal, final: opts.final })))).flat();
      for (const e of expected) e.cancel(); // the turn has its results; a pending one's final is not kept
    } else {
      // An exact re-publication was dropped: its result may be older than any reader.
      for (const e of expected) e.cancel();
      const got = await opts.client.awaitResults(opts.conversationId, attempt.dispatched, {
        fromSeq: fresh ? fromSeq : 0,
        signal: opts.signal,
        final: opts.final,
      });
      results = attempt.dispatched.map((id) => got.get(id)!);
    }
    return { content, toolResults: results.map(toToolResult), attempts };
  }
  throw new Error(`toolq: turn ${opts.turnIndex} of ${opts.conversationId}: ${max} attempts failed; last: ${attempts.at(-1)?.error}`);
}
