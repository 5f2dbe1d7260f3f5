"""The agent's side of toolq over NATS JetStream: publish each completed tool
call as a job and await the result addressed to its tool_use_id, with the
subjects, headers and bodies of the Go and TypeScript clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import NoStreamResponseError

from toolq.key import Args, FieldError, call_material, canonicalize, key_of

__all__ = [
    "HEADER_KEY",
    "JOBS_STREAM",
    "LOOKUP_SUBJECT",
    "RESULTS_STREAM",
    "TOOLS_SUBJECT",
    "Client",
    "Job",
    "Lookup",
    "LookupError",
    "Published",
    "Result",
    "ResultError",
    "ResultsReader",
    "Status",
    "ToolCall",
    "ToolFormat",
    "ToolsError",
    "job_msg_id",
    "job_subject",
    "new_tool_use_id",
    "result_subject",
]

JOBS_STREAM = "TOOLQ_JOBS"
RESULTS_STREAM = "TOOLQ_RESULTS"
HEADER_KEY = "Toolq-Key"
HEADER_MSG_ID = "Nats-Msg-Id"
VERSION = 1

Status = Literal["ok", "error", "rejected", "indeterminate"]

_TOOL_USE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def job_subject(tool: str) -> str:
    return f"toolq.jobs.{tool}"


def result_subject(conversation_id: str) -> str:
    return f"toolq.results.{conversation_id}"


def job_msg_id(key: str, tool_use_id: str) -> str:
    return f"job:{key}:{tool_use_id}"


def new_tool_use_id() -> str:
    """A toolu_-style id."""
    return "toolu_" + secrets.token_urlsafe(18).replace("-", "A").replace("_", "B")


@dataclass(frozen=True)
class Job:
    """One completed tool call of an assistant turn (job v1, docs/schema/job.v1.json)."""

    conversation_id: str
    turn_index: int
    tool: str
    tool_use_id: str
    #: The JSON text of the arguments as the model streamed it, or a mapping.
    args: Args
    #: Position among identical calls (same tool, same canonical args) of the turn.
    ordinal: int = 0


@dataclass(frozen=True)
class Published:
    key: str
    stream: str
    seq: int
    #: JetStream dropped it as an exact re-publication (same key and tool_use_id).
    duplicate: bool


@dataclass(frozen=True)
class ResultError:
    code: str
    message: str


@dataclass(frozen=True)
class Result:
    """The answer to one job (result v1, docs/schema/result.v1.json)."""

    version: int
    key: str
    conversation_id: str
    turn_index: int
    ordinal: int
    tool: str
    tool_use_id: str
    status: Status
    duplicate: bool
    attempts: int
    completed_at: str
    output: Any = None
    error: ResultError | None = None
    original_tool_use_id: str = ""

    @classmethod
    def from_json(cls, data: bytes | str) -> Result:
        d = json.loads(data)
        if not isinstance(d, dict) or d.get("version") != VERSION:
            raise ValueError(f"not a result v{VERSION}")
        err = d.get("error")
        return cls(
            version=d["version"],
            key=d["key"],
            conversation_id=d["conversation_id"],
            turn_index=d["turn_index"],
            ordinal=d["ordinal"],
            tool=d["tool"],
            tool_use_id=d["tool_use_id"],
            status=d["status"],
            duplicate=d.get("duplicate", False),
            attempts=d.get("attempts", 0),
            completed_at=d.get("completed_at", ""),
            output=d.get("output"),
            error=ResultError(code=err["code"], message=err.get("message", "")) if err else None,
            original_tool_use_id=d.get("original_tool_use_id", ""),
        )

    def tool_result(self) -> dict[str, Any]:
        """The tool_result block to append to the turn for this call (the
        Anthropic Messages API's shape): the output for ok, else an error the
        model can read."""
        if self.status == "ok":
            content = json.dumps(self.output, ensure_ascii=False)
            return {"type": "tool_result", "tool_use_id": self.tool_use_id, "content": content}
        error = self.error or ResultError(code=self.status, message="")
        content = json.dumps({"status": self.status, "error": {"code": error.code, "message": error.message}}, ensure_ascii=False)
        return {"type": "tool_result", "tool_use_id": self.tool_use_id, "content": content, "is_error": True}


LOOKUP_SUBJECT = "toolq.ledger.get"


@dataclass(frozen=True)
class Lookup:
    """What the ledger knows of a key."""

    key: str
    #: "unknown" (no row: never ran, or purged), "in_flight", "completed", "failed" or "indeterminate".
    state: Literal["unknown", "in_flight", "completed", "failed", "indeterminate"]
    attempt: int = 0
    first_tool_use_id: str = ""
    #: The output of a completed call.
    output: Any = None
    error: ResultError | None = None
    lease_remaining_ms: int = 0
    updated_at: str = ""


class LookupError(RuntimeError):
    """A lookup the service refused (a malformed key: 400; the ledger unreachable: 503)."""

    def __init__(self, code: str, description: str) -> None:
        super().__init__(f"toolq: lookup refused: {code} {description}")
        self.code = code
        self.description = description


TOOLS_SUBJECT = "toolq.tools.list"

#: The APIs whose tool definitions the consumers answer with: "anthropic" (the
#: Messages API's tools), "openai" (Chat Completions' tools), "openai-responses"
#: (the Responses API's function tools) or "mcp" (MCP Tool objects, as a
#: tools/list result's tools).
ToolFormat = Literal["anthropic", "openai", "openai-responses", "mcp"]


class ToolsError(RuntimeError):
    """A tool list the service refused (an unknown format: 400; a tool whose schema no API takes: 500)."""

    def __init__(self, code: str, description: str) -> None:
        super().__init__(f"toolq: tool list refused: {code} {description}")
        self.code = code
        self.description = description


@dataclass(frozen=True)
class ToolCall:
    """One tool_use block of a completed assistant turn."""

    tool_use_id: str
    tool: str
    #: The JSON text of the input as the model streamed it, or a mapping.
    args: Args

    @classmethod
    def from_block(cls, block: Any) -> ToolCall:
        """From a tool_use block: a mapping ({"id","name","input"}) or an SDK object with those attributes."""
        if isinstance(block, Mapping):
            return cls(tool_use_id=block["id"], tool=block["name"], args=block["input"])
        return cls(tool_use_id=block.id, tool=block.name, args=block.input)


def _traceparent() -> dict[str, str]:
    """The W3C trace context of the active OpenTelemetry span, when the
    application has OpenTelemetry; else nothing."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return {}
    carrier: dict[str, str] = {}
    with contextlib.suppress(Exception):  # tracing never stops a publish
        propagate.inject(carrier)
    return {k: v for k, v in carrier.items() if k in ("traceparent", "tracestate")}


class Client:
    """The agent's client: give it a connected nats.aio.client.Client."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.js = nc.jetstream()

    async def publish(self, job: Job, *, traceparent: str | None = None) -> Published:
        """Validates the job, derives its key and publishes it on
        toolq.jobs.<tool> with the Toolq-Key header, the Nats-Msg-Id
        job:<key>:<tool_use_id> and the trace context (the active
        OpenTelemetry span's, else traceparent as given). Raises a
        CallKeyError for a job that has no key."""
        if not isinstance(job.tool_use_id, str) or not _TOOL_USE_ID.fullmatch(job.tool_use_id):
            raise FieldError(f"tool_use_id: must match ^{_TOOL_USE_ID.pattern}$", field="tool_use_id")
        material = call_material(
            conversation_id=job.conversation_id, turn_index=job.turn_index, tool=job.tool, ordinal=job.ordinal, args=job.args
        )
        key = key_of(material)
        canonical = material.split("|", 4)[4]
        body = (
            f'{{"version":{VERSION},"conversation_id":{json.dumps(job.conversation_id)},"turn_index":{job.turn_index},'
            f'"ordinal":{job.ordinal},"tool":{json.dumps(job.tool)},"tool_use_id":{json.dumps(job.tool_use_id)},'
            f'"args":{canonical},"created_at":{json.dumps(datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"))}}}'
        )
        headers = {HEADER_KEY: key, HEADER_MSG_ID: job_msg_id(key, job.tool_use_id)}
        headers.update(_traceparent())
        if "traceparent" not in headers and traceparent:
            headers["traceparent"] = traceparent
        try:
            ack = await self.js.publish(job_subject(job.tool), body.encode("utf-8"), stream=JOBS_STREAM, headers=headers)
        except NoStreamResponseError as e:
            raise RuntimeError(
                f"no stream takes {job_subject(job.tool)}: the streams are created by the first consumer that starts: "
                "start one (`consumer`) against this NATS server, or check its URL"
            ) from e
        return Published(key=key, stream=ack.stream, seq=ack.seq, duplicate=bool(ack.duplicate))

    async def lookup(self, key: str, *, timeout: float = 5.0) -> Lookup:
        """What the ledger knows of a key (the consumers' lookup service, on
        toolq.ledger.get): did this call already happen, and how did it end?
        Raises LookupError when the service refuses the request."""
        msg = await self.nc.request(LOOKUP_SUBJECT, key.encode(), timeout=timeout)
        headers = msg.headers or {}
        if code := headers.get("Nats-Service-Error-Code"):
            raise LookupError(code, headers.get("Nats-Service-Error", ""))
        d = json.loads(msg.data)
        err = d.get("error")
        return Lookup(
            key=d["key"],
            state=d["state"],
            attempt=d.get("attempt", 0),
            first_tool_use_id=d.get("first_tool_use_id", ""),
            output=d.get("output"),
            error=ResultError(code=err["code"], message=err.get("message", "")) if err else None,
            lease_remaining_ms=d.get("lease_remaining_ms", 0),
            updated_at=d.get("updated_at", ""),
        )

    async def tools(self, format: ToolFormat, *, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The consumers' registry as the tool definitions of format (the
        tool list service, on toolq.tools.list), to hand the model as they
        are, so that the agent's tool list is the registry's. Consumers that
        run different registries each answer with their own. Raises
        ToolsError when the service refuses the request, and
        nats.errors.NoRespondersError when no consumer answers."""
        msg = await self.nc.request(TOOLS_SUBJECT, json.dumps({"format": format}).encode(), timeout=timeout)
        headers = msg.headers or {}
        if code := headers.get("Nats-Service-Error-Code"):
            raise ToolsError(code, headers.get("Nats-Service-Error", ""))
        definitions: list[dict[str, Any]] = json.loads(msg.data)
        return definitions

    async def results_cursor(self) -> int:
        """The sequence the next result will get: every result of a job
        published after this call comes at or after it."""
        info = await self.js.stream_info(RESULTS_STREAM)
        return int(info.state.last_seq) + 1

    async def await_result(self, conversation_id: str, tool_use_id: str, *, from_seq: int = 0, timeout: float | None = None) -> Result:
        """The result addressed to tool_use_id in the conversation, one
        published before the call included (from_seq 0: read from the
        start); the latest answer when there are several."""
        got = await self.await_results(conversation_id, [tool_use_id], from_seq=from_seq, timeout=timeout)
        return got[tool_use_id]

    async def await_results(
        self, conversation_id: str, tool_use_ids: Sequence[str], *, from_seq: int = 0, timeout: float | None = None
    ) -> dict[str, Result]:
        """Reads the conversation's results from from_seq (0: the first)
        until it has one for each tool_use_id and has read every result
        published before it started; results for other ids are skipped. A
        later answer to an id supersedes an earlier one (the call run after
        an operator resolved it as not run answers after its
        indeterminate)."""
        want = set(tool_use_ids)
        got: dict[str, Result] = {}
        config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL)
        if from_seq > 0:
            config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=from_seq)
        sub = await self.js.subscribe(result_subject(conversation_id), stream=RESULTS_STREAM, ordered_consumer=True, config=config)

        async def read() -> None:
            caught_up = False
            while len(got) < len(want) or not caught_up:
                msg = await sub.next_msg(timeout=None)
                caught_up = _pending(msg) == 0
                try:
                    r = Result.from_json(msg.data)
                except (ValueError, KeyError, TypeError):
                    continue
                if r.tool_use_id in want:
                    got[r.tool_use_id] = r

        try:
            await asyncio.wait_for(read(), timeout)
        finally:
            await sub.unsubscribe()
        return got

    async def publish_and_await(self, job: Job, *, timeout: float | None = None) -> Result:
        """Publishes the job and waits for its result, reading only the
        results published after it (from the start when JetStream dropped
        the job as an exact re-publication: its result may be older)."""
        from_seq = await self.results_cursor()
        pub = await self.publish(job)
        return await self.await_result(job.conversation_id, job.tool_use_id, from_seq=0 if pub.duplicate else from_seq, timeout=timeout)

    async def run_turn(
        self, conversation_id: str, turn_index: int, calls: Sequence[ToolCall | Mapping[str, Any]], *, timeout: float | None = None
    ) -> list[dict[str, Any]]:
        """Publishes the tool calls of one completed assistant turn and
        returns their tool_result blocks, in the order of the calls.
        Identical calls (same tool and canonical args) get ordinals 0, 1, …
        in order of appearance; results addressed to other tool_use_ids (an
        abandoned attempt's) are ignored. Run again for the same turn (the
        agent restarted), it returns the results the first run got."""
        tool_calls = [c if isinstance(c, ToolCall) else ToolCall.from_block(c) for c in calls]
        # Every call is checked before any is published: a turn with a call
        # that has no key raises with nothing run.
        identities = [f"{c.tool}|{canonicalize(c.args)}" for c in tool_calls]
        for c in tool_calls:
            call_material(conversation_id=conversation_id, turn_index=turn_index, tool=c.tool, args=c.args)
            if not isinstance(c.tool_use_id, str) or not _TOOL_USE_ID.fullmatch(c.tool_use_id):
                raise FieldError(f"tool_use_id: must match ^{_TOOL_USE_ID.pattern}$", field="tool_use_id")
        from_seq = await self.results_cursor()
        seen: dict[str, int] = {}
        for c, identity in zip(tool_calls, identities, strict=True):
            ordinal = seen.get(identity, 0)
            seen[identity] = ordinal + 1
            pub = await self.publish(
                Job(
                    conversation_id=conversation_id,
                    turn_index=turn_index,
                    tool=c.tool,
                    tool_use_id=c.tool_use_id,
                    args=c.args,
                    ordinal=ordinal,
                )
            )
            if pub.duplicate:
                from_seq = 0  # its result may be older than the cursor
        ids = [c.tool_use_id for c in tool_calls]
        got = await self.await_results(conversation_id, ids, from_seq=from_seq, timeout=timeout)
        return [got[i].tool_result() for i in ids]

    async def results(self, subject: str = "toolq.results.>") -> ResultsReader:
        """A reader of the results published from now on: one ordered
        consumer serving every await, as an agent that plays many turns
        wants."""
        return await ResultsReader.start(self, subject)


def _pending(msg: Msg) -> int:
    try:
        return int(msg.metadata.num_pending)
    except Exception:
        return 0


class ResultsReader:
    """Reads the results stream through one ordered consumer and hands each
    result to whoever expects its tool_use_id; a result nobody expects (an
    abandoned attempt's, another agent's) is dropped at once. Expect an id
    before publishing its job."""

    def __init__(self) -> None:
        # Waits by (conversation_id, tool_use_id); "" for any conversation.
        self._waiting: dict[tuple[str, str], asyncio.Future[Result]] = {}
        self._task: asyncio.Task[None] | None = None
        self._sub: Any = None
        self._error: BaseException | None = None

    @classmethod
    async def start(cls, client: Client, subject: str) -> ResultsReader:
        r = cls()
        r._sub = await client.js.subscribe(
            subject, stream=RESULTS_STREAM, ordered_consumer=True, config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.NEW)
        )
        r._task = asyncio.create_task(r._read())
        return r

    async def _read(self) -> None:
        try:
            while True:
                msg = await self._sub.next_msg(timeout=None)
                try:
                    res = Result.from_json(msg.data)
                except (ValueError, KeyError, TypeError):
                    continue
                fut = self._waiting.pop((res.conversation_id, res.tool_use_id), None) or self._waiting.pop(("", res.tool_use_id), None)
                if fut is not None and not fut.done():
                    fut.set_result(res)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # the subscription failed: every wait ends with it
            self._error = e
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(RuntimeError(f"toolq: results reader stopped: {e}"))
            self._waiting.clear()

    def expect(self, *tool_use_ids: str, conversation_id: str = "") -> list[asyncio.Future[Result]]:
        """Starts keeping the results addressed to the ids (of that
        conversation, when given: a tool_use_id may recur in another, a
        replayed model response say); await the futures."""
        if self._error is not None:
            raise RuntimeError(f"toolq: results reader stopped: {self._error}")
        loop = asyncio.get_running_loop()
        futures = []
        for i in tool_use_ids:
            fut: asyncio.Future[Result] = loop.create_future()
            self._waiting[(conversation_id, i)] = fut
            futures.append(fut)
        return futures

    def cancel(self, *tool_use_ids: str, conversation_id: str = "") -> None:
        """Stops keeping the ids' results: those that come later are dropped."""
        for i in tool_use_ids:
            fut = self._waiting.pop((conversation_id, i), None)
            if fut is not None:
                fut.cancel()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        for fut in self._waiting.values():
            fut.cancel()
        self._waiting.clear()
