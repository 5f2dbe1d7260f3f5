"""The conversation record, as the Go client's jobs.Conversation keeps it: a
turn is committed once, with one tool_result per tool_use; a call the
stream cut before its block completed is recorded "not run (connection
lost)" and never published; results of an abandoned attempt are ignored."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from toolq.client import Client, Job, Published, Result, ResultsReader, ToolCall, is_final
from toolq.key import CallKeyError, canonicalize

__all__ = [
    "NOT_RUN",
    "Attempt",
    "AttemptAbandonedError",
    "CommittedTurn",
    "Conversation",
    "NotNextTurnError",
    "Turn",
    "TurnCommittedError",
]

#: The tool_result content of a call whose stream was cut before its
#: tool_use block completed: it was never sent to toolq.
NOT_RUN = "not run (connection lost)"


class TurnCommittedError(RuntimeError):
    """The turn is committed, or being committed."""


class AttemptAbandonedError(RuntimeError):
    """The attempt was abandoned (another attempt of the turn started or was committed)."""


class NotNextTurnError(RuntimeError):
    """Another turn took this turn's index."""


@dataclass
class CommittedTurn:
    """One turn as it stands in the record."""

    index: int
    #: The assistant turn's tool_use blocks, in order.
    tool_uses: list[ToolCall] = field(default_factory=list)
    #: One tool_result block per tool use, in the same order.
    tool_results: list[dict[str, Any]] = field(default_factory=list)
    #: The result behind each tool_result (None for a call not run).
    results: list[Result | None] = field(default_factory=list)


class Conversation:
    """An agent's record of one conversation. Its jobs are published through
    client, its results read by reader (one ordered consumer for every
    conversation of the agent)."""

    def __init__(self, client: Client, reader: ResultsReader, conversation_id: str) -> None:
        self.id = conversation_id
        self.client = client
        self.reader = reader
        self.turns: list[CommittedTurn] = []
        self.abandoned: set[str] = set()  # tool_use_ids of abandoned attempts and cut calls
        self.not_run = 0

    def next_turn(self) -> Turn:
        """The turn after the last committed one, to be played in attempts."""
        return Turn(self, len(self.turns))

    def check(self) -> None:
        """Verifies the record: every committed turn has exactly one
        tool_result per tool_use, addressed to that block's id, in order; a
        call that was not run says NOT_RUN and nothing else; and no
        tool_result is addressed to an id of an abandoned attempt. Raises
        AssertionError at the first breach."""
        for i, ct in enumerate(self.turns):
            if ct.index != i:
                raise AssertionError(f"conversation {self.id}: turn {i} has index {ct.index}")
            if len(ct.tool_results) != len(ct.tool_uses):
                raise AssertionError(
                    f"conversation {self.id}: turn {i} has {len(ct.tool_uses)} tool_use and {len(ct.tool_results)} tool_result"
                )
            seen: set[str] = set()
            for use, tr, res in zip(ct.tool_uses, ct.tool_results, ct.results, strict=False):
                if use.tool_use_id in seen:
                    raise AssertionError(f"conversation {self.id}: turn {i}: tool_use {use.tool_use_id} twice")
                if tr["tool_use_id"] != use.tool_use_id:
                    raise AssertionError(
                        f"conversation {self.id}: turn {i}: tool_result for {tr['tool_use_id']} where {use.tool_use_id} was used"
                    )
                if tr["tool_use_id"] in self.abandoned:
                    raise AssertionError(f"conversation {self.id}: turn {i}: a result for {tr['tool_use_id']} of an abandoned attempt")
                if res is None and (not tr.get("is_error") or not _local(tr["content"])):
                    raise AssertionError(f"conversation {self.id}: turn {i}: {use.tool_use_id} has a result toolq never sent")
                if res is not None and res.tool_use_id != use.tool_use_id:
                    raise AssertionError(
                        f"conversation {self.id}: turn {i}: the result of {use.tool_use_id} is addressed to {res.tool_use_id}"
                    )
                seen.add(use.tool_use_id)


def _local(content: str) -> bool:
    """Whether a tool_result's content is one the record writes itself: a
    call not run, or refused before it was sent."""
    if content == json.dumps(NOT_RUN):
        return True
    try:
        return bool(json.loads(content).get("status") == "rejected")
    except (ValueError, AttributeError):
        return False


@dataclass
class _Use:
    call: ToolCall
    dispatched: bool
    future: asyncio.Future[Result] | None = None
    # JetStream dropped the job as an exact re-publication: its result may
    # have come before the reader started; commit reads it from the start.
    republished: bool = False
    # A call toolq would refuse (its args have no key): never sent, answered
    # in the record with why.
    refused: CallKeyError | None = None
    # The final result of a call whose first awaited approval, once a
    # commit with final got it.
    final: Result | None = None


class Turn:
    """The turn after the last committed one."""

    def __init__(self, conversation: Conversation, index: int) -> None:
        self.conversation = conversation
        self.index = index
        self._attempts: list[Attempt] = []
        self._committing = False
        self._committed = False
        self._winner: Attempt | None = None

    def attempt(self) -> Attempt:
        """A new attempt of the turn; the previous ones are abandoned (the
        model's retry of a turn emits its calls again with new ids)."""
        prev = list(self._attempts)
        a = Attempt(self)
        self._attempts.append(a)
        for p in prev:
            p.abandon()
        return a

    async def commit(self, attempt: Attempt, *, timeout: float | None = None, final: bool = False) -> CommittedTurn:
        """Waits for the results of the attempt's calls and appends the turn
        to the record: its tool_use blocks and one tool_result per block,
        NOT_RUN for a block that was cut. A call awaiting a person's approval
        is committed with its pending tool_result (not an error:
        Result.tool_result) unless final; its final result is
        Client.await_result's with final=True, or Client.lookup's by its key,
        in a later turn. The other attempts are abandoned."""
        if self._committed or self._committing:
            raise TurnCommittedError(f"turn {self.index} already committed")
        if attempt.turn is not self or attempt.abandoned:
            raise AttemptAbandonedError("the attempt was abandoned")
        self._committing, self._winner = True, attempt
        uses = list(attempt.uses)
        try:
            results = await self._await(uses, timeout, final)
        except BaseException:
            self._committing, self._winner = False, None
            raise
        c = self.conversation
        if len(c.turns) != self.index:
            self._committing, self._winner = False, None
            raise NotNextTurnError(f"turn {self.index} is not the conversation's next")
        ct = CommittedTurn(index=self.index)
        for u in uses:
            ct.tool_uses.append(u.call)
            if u.refused is not None:
                content = json.dumps({"status": "rejected", "error": {"code": u.refused.vector_rule, "message": str(u.refused)}})
                ct.tool_results.append({"type": "tool_result", "tool_use_id": u.call.tool_use_id, "content": content, "is_error": True})
                ct.results.append(None)
                continue
            if not u.dispatched:
                ct.tool_results.append(
                    {"type": "tool_result", "tool_use_id": u.call.tool_use_id, "content": json.dumps(NOT_RUN), "is_error": True}
                )
                ct.results.append(None)
                c.not_run += 1
                continue
            r = results[u.call.tool_use_id]
            ct.tool_results.append(r.tool_result())
            ct.results.append(r)
        c.turns.append(ct)
        self._committed, self._committing = True, False
        for u in uses:
            if u.future is not None and not u.republished:
                c.reader.cancel(u.call.tool_use_id, conversation_id=c.id)  # the record has its result
        for o in self._attempts:
            if o is not attempt:
                o.abandon()
        return ct

    async def _await(self, uses: list[_Use], timeout: float | None, final: bool) -> dict[str, Result]:
        got: dict[str, Result] = {}

        async def wait() -> None:
            republished = []
            for u in uses:
                if not u.dispatched:
                    continue
                if u.republished or u.future is None:
                    republished.append(u.call.tool_use_id)
                else:
                    # Shielded: a commit that times out leaves the wait in
                    # place, so that committing again gets the result.
                    got[u.call.tool_use_id] = r = await asyncio.shield(u.future)
                    if final and not is_final(r.status):
                        if u.final is None:  # the reader lets the id go once it gave the final result
                            [u.final] = await self.conversation.reader.wait(
                                u.call.tool_use_id, conversation_id=self.conversation.id, final=True
                            )
                        got[u.call.tool_use_id] = u.final
            if republished:
                got.update(await self.conversation.client.await_results(self.conversation.id, republished, final=final))

        await asyncio.wait_for(wait(), timeout)
        return got


class Attempt:
    """One streamed response of the turn: each tool_use block is dispatched
    when it completes, or, if the stream was cut first, recorded as not run."""

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.uses: list[_Use] = []
        self._ordinals: dict[str, int] = {}
        self.abandoned = False

    async def dispatch(self, call: ToolCall) -> Published:
        """Publishes a completed tool_use block as a job, with the next ordinal
        among identical calls of this attempt, while the stream goes on. After
        a publish error the attempt is abandoned: retry the turn (the retry's
        call has the same key, so it runs at most once)."""
        t = self.turn
        if t._committed or t._committing:
            raise TurnCommittedError(f"turn {t.index} already committed")
        if self.abandoned:
            raise AttemptAbandonedError("the attempt was abandoned")
        try:
            identity = f"{call.tool}|{canonicalize(call.args)}"
        except CallKeyError as e:
            # Not a call toolq can run (no key: an integer beyond 2^53, input
            # cut short by max_tokens): recorded as refused, never sent, and
            # no reason to retry the turn.
            self.uses.append(_Use(call=call, dispatched=False, refused=e))
            raise
        ordinal = self._ordinals.get(identity, 0)
        self._ordinals[identity] = ordinal + 1
        [future] = t.conversation.reader.expect(call.tool_use_id, conversation_id=t.conversation.id)
        use = _Use(call=call, dispatched=True, future=future)
        self.uses.append(use)
        job = Job(
            conversation_id=t.conversation.id,
            turn_index=t.index,
            tool=call.tool,
            tool_use_id=call.tool_use_id,
            args=call.args,
            ordinal=ordinal,
        )
        try:
            pub = await t.conversation.client.publish(job)
        except BaseException:
            self.abandon()  # whether it reached the stream is unknown
            raise
        if pub.duplicate:
            use.republished = True
            t.conversation.reader.cancel(call.tool_use_id, conversation_id=t.conversation.id)  # may never pass the reader again
        return pub

    def cut(self, call: ToolCall) -> None:
        """Records a tool_use block the stream's failure cut before it
        completed: it is not sent to toolq, and the record says NOT_RUN."""
        self.uses.append(_Use(call=call, dispatched=False))

    def abandon(self) -> None:
        """Gives the attempt up: results addressed to its ids are dropped, and
        it can no longer be committed."""
        if self.abandoned or self is self.turn._winner:
            return
        self.abandoned = True
        c = self.turn.conversation
        for u in self.uses:
            if u.future is not None:
                c.reader.cancel(u.call.tool_use_id, conversation_id=c.id)
            c.abandoned.add(u.call.tool_use_id)
            if not u.dispatched and u.refused is None:
                c.not_run += 1
