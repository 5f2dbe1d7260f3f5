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
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api
from nats.js.client import JetStreamContext
from nats.js.errors import NoStreamResponseError

from toolq.key import RESERVED_TENANTS, Args, FieldError, call_material, canonicalize, key_of, valid_tenant

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
    "ResultApproval",
    "ResultError",
    "ResultsReader",
    "Status",
    "ToolCall",
    "ToolFormat",
    "ToolsError",
    "is_final",
    "job_msg_id",
    "job_subject",
    "new_tool_use_id",
    "result_subject",
    "supersedes",
]

JOBS_STREAM = "TOOLQ_JOBS"
RESULTS_STREAM = "TOOLQ_RESULTS"
HEADER_KEY = "Toolq-Key"
HEADER_MSG_ID = "Nats-Msg-Id"
VERSION = 1

#: A result's status. Every status is final but "awaiting_approval": the call
#: waits for a person's decision and has not run, and its final result ("ok",
#: "error", …, or "denied" / "expired": it never ran) follows for the same
#: tool_use_id.
Status = Literal["ok", "error", "rejected", "indeterminate", "awaiting_approval", "denied", "expired"]


def is_final(status: str) -> bool:
    """Whether a result with this status is the call's last word: every status but "awaiting_approval"."""
    return status != "awaiting_approval"


def supersedes(prev: Result | None, new: Result) -> bool:
    """Whether new, read after prev (None: none) for the same tool_use_id,
    answers the call instead: a later answer supersedes an earlier one,
    except that a pending one never supersedes a final one (a pending answer
    that a decision overtook)."""
    return prev is None or is_final(new.status) or not is_final(prev.status)


_TOOL_USE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def job_subject(tool: str) -> str:
    return f"toolq.jobs.{tool}"


def result_subject(conversation_id: str) -> str:
    return f"toolq.results.{conversation_id}"


def _tenant_prefix(tenant: str) -> str:
    return "toolq." if tenant == "" else f"toolq.{tenant}."


def tenant_job_subject(tenant: str, tool: str) -> str:
    """A tenant's job subject (docs/tenants.md): toolq.jobs.<tool> for the default tenant "", toolq.<tenant>.jobs.<tool> for another."""
    return f"{_tenant_prefix(tenant)}jobs.{tool}"


def tenant_result_subject(tenant: str, conversation_id: str) -> str:
    return f"{_tenant_prefix(tenant)}results.{conversation_id}"


def tenant_lookup_subject(tenant: str) -> str:
    return f"{_tenant_prefix(tenant)}ledger.get"


def tenant_stream(tenant: str, stream: str) -> str:
    """A tenant's stream of a kind (RESULTS_STREAM, TOOLQ_DLQ, TOOLQ_APPROVALS): TOOLQ_<tenant>_RESULTS…;
    the default tenant's is the stream itself."""
    if tenant == "" or stream == JOBS_STREAM:
        return stream
    return f"TOOLQ_{tenant}_{stream[len('TOOLQ_') :]}"


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
class ResultApproval:
    """What a result says of the approval of a call that needed a person's."""

    #: The canonical args that run if approved.
    args: Any
    args_digest: str
    #: The approver group that decides.
    group: str
    requested_at: str
    expires_at: str
    #: Once decided: "approved", "denied" or "expired", by whom, why, when.
    decision: str = ""
    decided_by: str = ""
    reason: str = ""
    decided_at: str = ""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> ResultApproval | None:
        if not d:
            return None
        return cls(
            args=d.get("args"),
            args_digest=d.get("args_digest", ""),
            group=d.get("group", ""),
            requested_at=d.get("requested_at", ""),
            expires_at=d.get("expires_at", ""),
            decision=d.get("decision", ""),
            decided_by=d.get("decided_by", ""),
            reason=d.get("reason", ""),
            decided_at=d.get("decided_at", ""),
        )


_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d+)?(Z|[+-]\d\d:\d\d)", re.IGNORECASE)


def _utc_seconds(t: str) -> str:
    """A timestamp in UTC to the second, as Go's time.RFC3339 writes it."""
    m = _RFC3339.fullmatch(t)
    if m is None:
        return t
    at = datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%S")
    if m[2].upper() != "Z":
        offset = timedelta(hours=int(m[2][1:3]), minutes=int(m[2][4:6]))
        at = at - offset if m[2][0] == "+" else at + offset
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


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
    #: Set on the results of a call that needed a person's approval.
    approval: ResultApproval | None = None
    #: The job's tenant; "" for the default tenant.
    tenant: str = ""

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
            approval=ResultApproval.from_dict(d.get("approval")),
            tenant=d.get("tenant", ""),
        )

    def tool_result(self) -> dict[str, Any]:
        """The tool_result block to append to the turn for this call (the
        Anthropic Messages API's shape): the output for ok; for a call
        awaiting approval, not an error but text that says so
        (approval_text); else an error the model can read, {"status",
        "error": {"code", "message"}}, whose message for a denied or expired
        call is its approval_text. The Go and TypeScript clients give the
        same texts."""
        if self.status == "ok":
            content = json.dumps(self.output, ensure_ascii=False)
            return {"type": "tool_result", "tool_use_id": self.tool_use_id, "content": content}
        if self.status == "awaiting_approval":
            return {"type": "tool_result", "tool_use_id": self.tool_use_id, "content": self.approval_text()}
        error = self.error or ResultError(code=self.status, message="")
        message = self.approval_text() or error.message
        content = json.dumps({"status": self.status, "error": {"code": error.code, "message": message}}, ensure_ascii=False)
        return {"type": "tool_result", "tool_use_id": self.tool_use_id, "content": content, "is_error": True}

    def approval_text(self) -> str:
        """What the model reads of a call that a person had to approve and
        that has not run: for one awaiting approval "awaiting approval by a
        person (key …, expires …); the call has not run", for a denied one
        "denied by NAME: REASON; the call did not run", for an expired one
        that no person decided in time. "" for the other statuses."""
        a = self.approval
        expires = _utc_seconds(a.expires_at) if a and a.expires_at else ""
        if self.status == "awaiting_approval":
            return f"awaiting approval by a person (key {self.key}{', expires ' + expires if expires else ''}); the call has not run"
        if self.status == "denied":
            who = (a.decided_by if a else "") or "a person"
            reason = f": {a.reason}" if a and a.reason else ""
            return f"denied by {who}{reason}; the call did not run"
        if self.status == "expired":
            if expires:
                return f"expired: no person decided before {expires}; the call did not run"
            return "expired: no person decided in time; the call did not run"
        return ""


LOOKUP_SUBJECT = "toolq.ledger.get"


@dataclass(frozen=True)
class Lookup:
    """What the ledger knows of a key."""

    key: str
    #: "unknown" (no row: never ran, or purged), "in_flight", "completed",
    #: "failed", "indeterminate", or "awaiting_approval" (the call waits for a
    #: person's decision and has not run; approval says what is asked).
    state: Literal["unknown", "in_flight", "completed", "failed", "indeterminate", "awaiting_approval", "approved"]
    attempt: int = 0
    first_tool_use_id: str = ""
    #: The output of a completed call.
    output: Any = None
    error: ResultError | None = None
    lease_remaining_ms: int = 0
    updated_at: str = ""
    #: For a call whose tool asked a person: what was asked, and once
    #: decided, the decision (a denied or expired call is "failed").
    approval: ResultApproval | None = None


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
    """The agent's client: give it a connected nats.aio.client.Client.

    A tenant's client (docs/tenants.md; connect with inbox_prefix
    "_INBOX_<tenant>") publishes on toolq.<tenant>.jobs.<tool> with the
    tenant in the body and the key, awaits results in
    TOOLQ_<tenant>_RESULTS, looks keys up on toolq.<tenant>.ledger.get and
    drops any result that is not its tenant's. The default "" is the
    default tenant: today's subjects and keys."""

    def __init__(self, nc: NATS, *, tenant: str = "") -> None:
        if not isinstance(tenant, str) or not valid_tenant(tenant):
            raise FieldError(f"tenant: must be one subject token and not {', '.join(sorted(RESERVED_TENANTS))}", field="tenant")
        self.nc = nc
        self.js = nc.jetstream()
        self.tenant = tenant

    async def publish(self, job: Job, *, traceparent: str | None = None) -> Published:
        """Validates the job, derives its key and publishes it on
        toolq.jobs.<tool> with the Toolq-Key header, the Nats-Msg-Id
        job:<key>:<tool_use_id> and the trace context (the active
        OpenTelemetry span's, else traceparent as given). Raises a
        CallKeyError for a job that has no key."""
        if not isinstance(job.tool_use_id, str) or not _TOOL_USE_ID.fullmatch(job.tool_use_id):
            raise FieldError(f"tool_use_id: must match ^{_TOOL_USE_ID.pattern}$", field="tool_use_id")
        material = call_material(
            conversation_id=job.conversation_id,
            turn_index=job.turn_index,
            tool=job.tool,
            ordinal=job.ordinal,
            args=job.args,
            tenant=self.tenant,
        )
        key = key_of(material)
        canonical = material.split("|", 5 if self.tenant else 4)[-1]
        tenant = f'"tenant":{json.dumps(self.tenant)},' if self.tenant else ""
        body = (
            f'{{"version":{VERSION},{tenant}"conversation_id":{json.dumps(job.conversation_id)},"turn_index":{job.turn_index},'
            f'"ordinal":{job.ordinal},"tool":{json.dumps(job.tool)},"tool_use_id":{json.dumps(job.tool_use_id)},'
            f'"args":{canonical},"created_at":{json.dumps(datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"))}}}'
        )
        subject = tenant_job_subject(self.tenant, job.tool)
        headers = {HEADER_KEY: key, HEADER_MSG_ID: job_msg_id(key, job.tool_use_id)}
        headers.update(_traceparent())
        if "traceparent" not in headers and traceparent:
            headers["traceparent"] = traceparent
        try:
            ack = await self.js.publish(subject, body.encode("utf-8"), stream=JOBS_STREAM, headers=headers)
        except NoStreamResponseError as e:
            raise RuntimeError(
                f"no stream takes {subject}: the streams are created by the first consumer that starts: "
                "start one (`consumer`) against this NATS server, or check its URL"
            ) from e
        return Published(key=key, stream=ack.stream, seq=ack.seq, duplicate=bool(ack.duplicate))

    async def lookup(self, key: str, *, timeout: float = 5.0) -> Lookup:
        """What the ledger knows of a key (the consumers' lookup service, on
        toolq.ledger.get): did this call already happen, and how did it end?
        Does it still await a person's approval (state "awaiting_approval")?
        Raises LookupError when the service refuses the request."""
        msg = await self.nc.request(tenant_lookup_subject(self.tenant), key.encode(), timeout=timeout)
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
            approval=ResultApproval.from_dict(d.get("approval")),
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
        info = await self.js.stream_info(tenant_stream(self.tenant, RESULTS_STREAM))
        return int(info.state.last_seq) + 1

    async def await_result(
        self, conversation_id: str, tool_use_id: str, *, from_seq: int = 0, timeout: float | None = None, final: bool = False
    ) -> Result:
        """The result addressed to tool_use_id in the conversation, one
        published before the call included (from_seq 0: read from the
        start); the latest answer when there are several, a final one over
        one awaiting approval. A call awaiting a person's approval is
        returned as such (status "awaiting_approval"), so that the agent is
        never held up for hours, unless final: then it waits for the result
        that follows the decision."""
        got = await self.await_results(conversation_id, [tool_use_id], from_seq=from_seq, timeout=timeout, final=final)
        return got[tool_use_id]

    async def await_results(
        self, conversation_id: str, tool_use_ids: Sequence[str], *, from_seq: int = 0, timeout: float | None = None, final: bool = False
    ) -> dict[str, Result]:
        """Reads the conversation's results from from_seq (0: the first)
        until it has one for each tool_use_id (with final, a final one) and
        has read every result published before it started; results for
        other ids are skipped. A later answer to an id supersedes an earlier
        one (the call run after an operator resolved it as not run answers
        after its indeterminate; see supersedes)."""
        want = set(tool_use_ids)
        got: dict[str, Result] = {}

        def enough(r: Result | None) -> bool:
            return r is not None and (not final or is_final(r.status))

        subject, stream = tenant_result_subject(self.tenant, conversation_id), tenant_stream(self.tenant, RESULTS_STREAM)
        sub = await _ordered(self.js, subject, stream, from_seq)

        async def read() -> None:
            caught_up = False
            done = 0  # ids whose result ends the wait
            while done < len(want) or not caught_up:
                msg = await sub.next_msg(timeout=None)
                caught_up = _pending(msg) == 0
                try:
                    r = Result.from_json(msg.data)
                except (ValueError, KeyError, TypeError):
                    continue
                if r.tenant != self.tenant:
                    continue  # another tenant's result is never this client's
                prev = got.get(r.tool_use_id)
                if r.tool_use_id in want and supersedes(prev, r):
                    if not enough(prev) and enough(r):
                        done += 1
                    got[r.tool_use_id] = r

        try:
            await asyncio.wait_for(read(), timeout)
        finally:
            await sub.unsubscribe()
        return got

    async def publish_and_await(self, job: Job, *, timeout: float | None = None, final: bool = False) -> Result:
        """Publishes the job and waits for its result, reading only the
        results published after it (from the start when JetStream dropped
        the job as an exact re-publication: its result may be older). A
        call awaiting approval is returned as such unless final."""
        from_seq = await self.results_cursor()
        pub = await self.publish(job)
        return await self.await_result(
            job.conversation_id, job.tool_use_id, from_seq=0 if pub.duplicate else from_seq, timeout=timeout, final=final
        )

    async def run_turn(
        self,
        conversation_id: str,
        turn_index: int,
        calls: Sequence[ToolCall | Mapping[str, Any]],
        *,
        timeout: float | None = None,
        final: bool = False,
    ) -> list[dict[str, Any]]:
        """Publishes the tool calls of one completed assistant turn and
        returns their tool_result blocks, in the order of the calls.
        Identical calls (same tool and canonical args) get ordinals 0, 1, …
        in order of appearance; results addressed to other tool_use_ids (an
        abandoned attempt's) are ignored. Run again for the same turn (the
        agent restarted), it returns the results the first run got. A call
        awaiting approval gets its pending tool_result (not an error, see
        Result.tool_result) unless final."""
        tool_calls = [c if isinstance(c, ToolCall) else ToolCall.from_block(c) for c in calls]
        # Every call is checked before any is published: a turn with a call
        # that has no key raises with nothing run.
        identities = [f"{c.tool}|{canonicalize(c.args)}" for c in tool_calls]
        for c in tool_calls:
            call_material(conversation_id=conversation_id, turn_index=turn_index, tool=c.tool, args=c.args, tenant=self.tenant)
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
        got = await self.await_results(conversation_id, ids, from_seq=from_seq, timeout=timeout, final=final)
        return [got[i].tool_result() for i in ids]

    async def results(self, subject: str = "") -> ResultsReader:
        """A reader of the results published from now on: one ordered
        consumer serving every await, as an agent that plays many turns
        wants (subject: toolq.results.> by default; a tenant's:
        toolq.<tenant>.results.>)."""
        return await ResultsReader.start(self, subject or f"{_tenant_prefix(self.tenant)}results.>")


async def _ordered(js: JetStreamContext, subject: str, stream: str, from_seq: int) -> Any:
    """An ordered consumer of stream on subject from stream sequence
    from_seq (0 or 1: the first). nats-py recreates an ordered consumer
    that missed its heartbeats from the sequence after the last one it
    delivered, and from sequence 1 when it delivered none: told where this
    one started, it re-reads nothing before from_seq."""
    config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL)
    if from_seq > 1:
        config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=from_seq)
    sub: Any = await js.subscribe(subject, stream=stream, ordered_consumer=True, config=config)
    # nats-py's own state (2.16): a release without it re-reads from the
    # first message, as before, and loses nothing.
    jsi: Any = getattr(getattr(sub, "_sub", None), "_jsi", None)
    if from_seq > 1 and hasattr(jsi, "_sseq"):
        jsi._sseq = from_seq - 1
    return sub


def _pending(msg: Msg) -> int:
    try:
        return int(msg.metadata.num_pending)
    except Exception:
        return 0


@dataclass
class _Slot:
    """The latest result of an expected id, and the waits for it."""

    #: Resolved at the first result, a pending one included (expect's future).
    first: asyncio.Future[Result]
    result: Result | None = None
    waiters: list[tuple[bool, asyncio.Future[Result]]] = field(default_factory=list)

    def offer(self, res: Result) -> None:
        if not supersedes(self.result, res):
            return
        self.result = res
        if not self.first.done():
            self.first.set_result(res)
        keep: list[tuple[bool, asyncio.Future[Result]]] = []
        for final, fut in self.waiters:
            if fut.done():
                continue
            if not final or is_final(res.status):
                fut.set_result(res)
            else:
                keep.append((final, fut))
        self.waiters = keep

    def fail(self, err: BaseException) -> None:
        for fut in [self.first, *(f for _, f in self.waiters)]:
            if not fut.done():
                fut.set_exception(RuntimeError(f"toolq: results reader stopped: {err}"))


class ResultsReader:
    """Reads the results stream through one ordered consumer and hands each
    result to whoever expects its tool_use_id; a result nobody expects (an
    abandoned attempt's, another agent's) is dropped at once. Expect an id
    before publishing its job. An id whose first result awaits a person's
    approval stays expected until a wait took its final result, or cancel:
    wait(..., final=True) gives it."""

    def __init__(self) -> None:
        # Slots by (conversation_id, tool_use_id); "" for any conversation.
        self._waiting: dict[tuple[str, str], _Slot] = {}
        self._task: asyncio.Task[None] | None = None
        self._sub: Any = None
        self._error: BaseException | None = None
        self._tenant = ""

    @classmethod
    async def start(cls, client: Client, subject: str) -> ResultsReader:
        r = cls()
        r._tenant = client.tenant
        # From the stream's next sequence rather than DeliverPolicy.NEW: an
        # ordered consumer recreated before its first delivery starts where
        # this one did, not at what is new by then.
        r._sub = await _ordered(client.js, subject, tenant_stream(client.tenant, RESULTS_STREAM), await client.results_cursor())
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
                if res.tenant != self._tenant:
                    continue  # another tenant's result is never this reader's
                k = (res.conversation_id, res.tool_use_id)
                if k not in self._waiting:
                    k = ("", res.tool_use_id)
                slot = self._waiting.get(k)
                if slot is None:
                    continue
                slot.offer(res)
                if is_final(res.status) and slot.first.done() and not slot.first.cancelled() and slot.first.result() is res:
                    del self._waiting[k]  # final from the first: nothing follows, and nobody saw a pending one
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # the subscription failed: every wait ends with it
            self._error = e
            for slot in self._waiting.values():
                slot.fail(e)
            self._waiting.clear()

    def expect(self, *tool_use_ids: str, conversation_id: str = "") -> list[asyncio.Future[Result]]:
        """Starts keeping the results addressed to the ids (of that
        conversation, when given: a tool_use_id may recur in another, a
        replayed model response say); await the futures, resolved at each
        id's first result (one awaiting approval included), or wait()."""
        if self._error is not None:
            raise RuntimeError(f"toolq: results reader stopped: {self._error}")
        loop = asyncio.get_running_loop()
        futures = []
        for i in tool_use_ids:
            slot = _Slot(first=loop.create_future())
            self._waiting[(conversation_id, i)] = slot
            futures.append(slot.first)
        return futures

    async def wait(self, *tool_use_ids: str, conversation_id: str = "", final: bool = False, timeout: float | None = None) -> list[Result]:
        """The results of expected ids, in their order: the latest of each
        that came, the first if none came yet; with final, each id's final
        result, past one awaiting approval (call it again, with final, after
        a wait or a future gave a pending one). An id whose final result a
        wait returned is no longer expected. Raises ValueError for an id not
        expected (or no longer), and RuntimeError once the reader stopped."""
        if self._error is not None:
            raise RuntimeError(f"toolq: results reader stopped: {self._error}")
        keys = [(conversation_id, i) for i in tool_use_ids]
        slots = []
        for k in keys:
            if k not in self._waiting:
                raise ValueError(f"toolq: {k[1]} is not expected: expect it before publishing its job")
            slots.append(self._waiting[k])
        loop = asyncio.get_running_loop()

        async def one(slot: _Slot) -> Result:
            r = slot.result
            if r is not None and (not final or is_final(r.status)):
                return r
            fut: asyncio.Future[Result] = loop.create_future()
            slot.waiters.append((final, fut))
            return await fut

        got = await asyncio.wait_for(asyncio.gather(*(one(s) for s in slots)), timeout)
        for k, slot, r in zip(keys, slots, got, strict=True):
            if is_final(r.status) and self._waiting.get(k) is slot:
                del self._waiting[k]
        return list(got)

    def cancel(self, *tool_use_ids: str, conversation_id: str = "") -> None:
        """Stops keeping the ids' results: those that come later are dropped."""
        for i in tool_use_ids:
            slot = self._waiting.pop((conversation_id, i), None)
            if slot is not None:
                slot.first.cancel()
                for _, fut in slot.waiters:
                    fut.cancel()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        for slot in self._waiting.values():
            slot.first.cancel()
            for _, fut in slot.waiters:
                fut.cancel()
        self._waiting.clear()
