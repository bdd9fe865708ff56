"""``agentik chat``: a terminal chat with a running agentik, on :mod:`agentik.client`.

Input: in a terminal, lines as the terminal hands them over (its own line editing); a bracketed
paste, a line ended with Alt+Enter or ``\\``, or a ``\"\"\"`` block is one message. From a pipe,
the whole input is one message. Ctrl-C arrives as SIGINT on the event loop: it stops the reply
being streamed (or the request waiting for the server) and returns to the prompt; a second one
leaves.

Output: one event stream per conversation prints every turn as it arrives, with the messages
other viewers send. The client reconnects for as long as the chat is open (``[reconnecting…
Ns]``); what the server lost meanwhile (its ``Gap``) is made up from the history (:class:`Ledger`).

Approvals: a tool call that waits for a person (``ApprovalRequested``, or one found waiting when
a conversation is opened) is asked about, ``Run tool {args}? [y/N/e(dit)]``, and the turn shown
until it ends.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import ipaddress
import json
import os
import secrets
import signal
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

from agentik.client import (
    APIError,
    ClientError,
    ConnectionFailed,
    ExportFormat,
    RemoteAgent,
    RemoteConversation,
    RemoteEventStream,
    Unauthorized,
)
from agentik.core.approvals import PendingApproval
from agentik.core.protocol import read_history
from agentik.core.types import (
    AppendText,
    ApprovalRequested,
    Compacted,
    End,
    Error,
    Event,
    Gap,
    Interrupted,
    Message,
    StartReasoning,
    TextPart,
    ToolCall,
    ToolResult,
    Truncated,
    UserMessage,
    Via,
)

HELP = (
    "Type a message (Alt+Enter or a trailing \\ continues it on a new line; a pasted text and "
    'a """ block are one message). /new [title], /list, /open N|ID|TITLE, /rename TITLE, '
    "/history, /export FILE, /quit. Ctrl-C stops a reply, twice leaves."
)
LIST_SIZE = 10
HISTORY_SIZE = 20
PAGE = 200  # the API's largest page
SHORT = 80
INTERRUPT_GRACE = 2.0  # seconds an interrupted turn has to end before the prompt comes back
PASTE_ON, PASTE_OFF = "\x1b[?2004h", "\x1b[?2004l"
PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"
BLOCK = '"""'


class ChatError(Exception):
    """Why the chat could not start or go on: one line for the command line to print."""


def default_url(env: Mapping[str, str] = os.environ) -> str:
    """The server ``agentik serve`` would start with these variables (``AGENTIK_HOST``,
    ``AGENTIK_PORT``); a wildcard address is reached on loopback."""
    from agentik.core.settings import parse_port

    raw_port = env.get("AGENTIK_PORT", "").strip()
    try:
        port = parse_port(raw_port) if raw_port else 8080
    except ValueError as e:
        raise ChatError(f"AGENTIK_PORT={raw_port!r} {e}") from None
    host = env.get("AGENTIK_HOST", "").strip() or "127.0.0.1"
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    return f"http://{host}:{port}"


def short(text: str, limit: int = SHORT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def user_text(payload: Mapping[str, Any]) -> str:
    return " ".join(part.get("body", "[image]") for part in payload.get("content", []))


def who(via: Via | None) -> str:
    """How another viewer's message is labelled: the name it gave, else its transport."""
    if via is None:
        return "user"
    return via.sender or f"via {via.transport}"


def describe_message(m: Message) -> str:
    """One line of ``/history``."""
    p = m.payload
    if m.kind == "user":
        return f"you: {user_text(p)}"
    if m.kind == "assistant":
        return f"agent: {p.get('text', '')}" + (" [interrupted]" if p.get("interrupted") else "")
    if m.kind == "tool_call":
        return f"  tool {p.get('toolName')}({short(p.get('argsJson', ''), 60)})"
    if m.kind == "tool_result":
        mark = "✗" if p.get("isError") else "→"
        return f"  {mark} {short(p.get('text', ''))}"
    if m.kind == "approval":
        note = f" ({short(p['note'], 60)})" if p.get("note") else ""
        return f"  approval of {p.get('toolName')}: {p.get('status')}{note}"
    if m.kind == "error":
        return f"[error: {p.get('message')} ({p.get('code')})]"
    return f"[{m.kind}: {short(p.get('text', ''))}]"


# --- input -----------------------------------------------------------------------------------


class Input:
    """Bytes from the terminal or a pipe, assembled into messages.

    In a terminal each line is a message, except: a bracketed paste (the terminal wraps it in
    ``ESC[200~`` … ``ESC[201~``; the chat turns the mode on) is one message with the line it
    ends on, a line ending in ``\\`` or Alt+Enter (``ESC`` before the newline) goes on to the
    next, and a line of ``\"\"\"`` opens a block that the next such line closes. From a pipe
    (``whole=True``) everything up to the end is one message.
    """

    def __init__(self, whole: bool = False) -> None:
        self.whole = whole
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")  # splits in reads
        self.pending = ""  # a line not complete yet
        self.parts: list[str] = []  # lines of the message being assembled
        self.pasting = False
        self.block = False

    def feed(self, data: bytes) -> list[str]:
        """The messages ``data`` completes."""
        text = self.pending + self.decoder.decode(data)
        if self.whole:
            self.pending = text
            return []
        *lines, self.pending = text.split("\n")
        return [m for m in map(self._line, lines) if m is not None]

    def end(self) -> list[str]:
        """The input ended (Ctrl-D, the end of a pipe): what is left is the last message."""
        rest = self.pending + self.decoder.decode(b"", final=True)
        self.pending = ""
        if self.whole:
            return [rest] if rest.strip() else []
        last = self._line(rest) if rest else None
        if last is None and any(p.strip() for p in self.parts):
            last = self._finish()
        return [last] if last is not None else []

    def _line(self, line: str) -> str | None:
        line = line.removesuffix("\r")
        if PASTE_START in line:
            self.pasting = True
            line = line.replace(PASTE_START, "")
        if PASTE_END in line:
            self.pasting = False
            line = line.replace(PASTE_END, "")
        if self.pasting:
            self.parts.append(line)
            return None
        if self.block:
            if line.strip() == BLOCK:
                self.block = False
                return self._finish()
            self.parts.append(line)
            return None
        if not self.parts and line.strip() == BLOCK:
            self.block = True
            return None
        if line.endswith(("\x1b", "\\")):  # Alt+Enter, or a trailing backslash: go on
            self.parts.append(line[:-1])
            return None
        self.parts.append(line)
        return self._finish()

    def _finish(self) -> str:
        parts, self.parts = self.parts, []
        return "\n".join(parts).strip("\n")


# --- what was shown, and the history ----------------------------------------------------------


class Ledger:
    """What the chat has shown of its conversation, to tell what a ``Gap`` really lost.

    Events of a turn carry no record ids until its ``End`` (``turnId``), so after a Gap the
    chat reads the history after ``mark`` (the last record it read) and follows the turns in
    it: they run one at a time in the order their user messages were stored, a turn's
    ``assistant`` record ends the oldest open one and an ``error`` record names its own.
    """

    def __init__(self) -> None:
        self.mark: str | None = None  # the last history record read
        self.open: list[str] = []  # user messages whose turns had not ended at ``mark``
        self.users: set[str] = set()  # user messages shown (or typed here)
        self.ended: set[str] = set()  # turns whose end was shown
        self.tools: set[str] = set()  # tool call ids and result ids shown

    def follow(self, records: list[Message]) -> Iterator[tuple[Message, str | None]]:
        """Each record after ``mark`` with the turn it belongs to (a user record: itself; a
        summary: None); moves ``mark`` and ``open`` past them."""
        for record in records:
            turn: str | None = None
            if record.kind == "user":
                turn = record.id
                self.open.append(turn)
            elif record.kind in ("tool_call", "tool_result"):
                turn = self.open[0] if self.open else None
            elif record.kind == "error":
                turn = record.payload.get("userMessageId")
                if turn in self.open:
                    self.open.remove(turn)
            elif record.kind == "assistant":
                turn = self.open.pop(0) if self.open else None
            self.mark = record.id
            yield record, turn


async def find_conversation(agent: RemoteAgent, arg: str) -> RemoteConversation:
    """The conversation ``arg`` names: a number of ``/list``, an id or its start, a title or
    its start (case ignored). :class:`LookupError` says why none."""
    infos = await agent.list_conversations(0, PAGE)
    if arg.isdigit() and 1 <= int(arg) <= len(infos):
        matches = [infos[int(arg) - 1]]
    else:
        folded = arg.casefold()
        matches = (
            [i for i in infos if i.id == arg]
            or [i for i in infos if i.id.startswith(arg)]
            or [i for i in infos if (i.title or "").casefold() == folded]
            or [i for i in infos if (i.title or "").casefold().startswith(folded)]
        )
    if len(matches) > 1:
        names = ", ".join(f"{i.title or '(untitled)'} ({i.id})" for i in matches[:5])
        raise LookupError(f"{arg!r} could be {len(matches)} conversations: {names}")
    conv = await agent.get_conversation(matches[0].id if matches else arg)
    if conv is None:
        raise LookupError(f"no conversation {arg!r}")
    return conv


# --- the chat --------------------------------------------------------------------------------


class Chat:
    def __init__(
        self, agent: RemoteAgent, out: TextIO = sys.stdout, *, tty: bool = False, me: str = ""
    ) -> None:
        self.agent = agent
        self.out = out
        self.tty = tty  # the output is a terminal: a status line is rewritten in place
        self.me = me  # the sender name of this chat's messages
        self.conv: RemoteConversation | None = None
        self.stream: RemoteEventStream | None = None
        self.printer: asyncio.Task[None] | None = None
        self.messages: asyncio.Queue[str | None] = asyncio.Queue()
        self.asks: asyncio.Queue[PendingApproval] = asyncio.Queue()  # approvals to ask about
        self.asked: set[str] = set()  # the call ids asked about (a request comes only once)
        self.input = Input()
        self.action: asyncio.Future[bool] | None = None  # the line being carried out
        self.waiting: str | None = None  # our message whose turn is being shown
        self.turn_over = asyncio.Event()
        self.presses = 0  # Ctrl-C since the last line typed
        self.leave = asyncio.Event()
        self.mid_line = False  # the cursor is not at the start of a line
        self.at_prompt = False
        self.status_shown = False  # the last line is a status line (rewritten in place)
        self.in_reply = False  # the cursor is right after the agent's text: more text follows on
        self.reply: list[str] = []  # the text shown of the turn being streamed
        self.ledger = Ledger()
        # after a Gap: the replayed events, held until their turn's End says whether the
        # history already showed it (see hold)
        self.held: list[Event] | None = None
        self.skip: set[str] = set()
        self.skip_last: str | None = None
        self.window: set[str] = set()  # the user messages the history showed
        self.down_since: float | None = None  # the server has been out of reach since
        self.down_shown = -1
        self.background: set[asyncio.Future[Any]] = set()

    # --- output -------------------------------------------------------------------------------

    def say(self, text: str = "", end: str = "\n") -> None:
        if self.status_shown:
            self.out.write("\r\x1b[K" if self.tty else "\n")
            self.status_shown = self.mid_line = False
        elif self.mid_line:
            self.out.write("\n")
        self.out.write(text + end)
        self.out.flush()
        self.mid_line = not end.endswith("\n")
        self.at_prompt = self.in_reply = False

    def reply_text(self, text: str) -> None:
        """The agent's text, after ``agent> `` when it does not go on from the last text (not
        flushed: :meth:`print_events` does when no more events are waiting)."""
        if not self.in_reply:
            self.say("agent> ", end="")
            self.in_reply = True
        self.out.write(text)
        self.mid_line = not text.endswith("\n")

    def prompt(self) -> None:
        self.say("you> ", end="")
        self.at_prompt = True

    def status(self, text: str) -> None:
        """A line about the connection; in a terminal the next one replaces it."""
        at_prompt = self.at_prompt
        if self.tty:
            self.say(text, end="")
            self.status_shown = True
        else:
            self.say(text)
        self.at_prompt = at_prompt

    def on_retry(self, what: str, seconds: float, failure: Exception | None) -> None:
        """The client's report of a failed try (or of the server answering again)."""
        loop = asyncio.get_running_loop()
        if failure is None:
            if self.down_since is not None:
                down = loop.time() - self.down_since
                self.down_since, self.down_shown = None, -1
                at_prompt = self.at_prompt
                self.say(f"[reconnected after {down:.0f}s]")
                if at_prompt:
                    self.prompt()
            return
        if self.down_since is None:
            self.down_since = loop.time() - seconds
        down = int(loop.time() - self.down_since)
        if down != self.down_shown and (self.tty or self.down_shown < 0):
            self.down_shown = down
            self.status(f"[reconnecting… {down}s]")

    # --- terminal input -----------------------------------------------------------------------

    def on_input(self, fd: int) -> None:
        data = os.read(fd, 65536)
        if data:
            for message in self.input.feed(data):
                self.messages.put_nowait(message)
            return
        # end of input (Ctrl-D): a pipe at its end stays readable, so stop watching it
        asyncio.get_running_loop().remove_reader(fd)
        for message in self.input.end():
            self.messages.put_nowait(message)
        self.messages.put_nowait(None)

    def on_interrupt(self) -> None:
        self.presses += 1
        if self.presses >= 2:
            self.leave.set()
            return
        action = self.action
        if action is None or action.done():
            self.say("(Ctrl-C again or /quit to leave)")
            self.prompt()
        elif self.waiting is not None and self.conv is not None:
            # a turn is streaming: stop it, and give the prompt back even if the server is gone
            self.spawn(self._interrupt(self.conv, self.waiting))
            asyncio.get_running_loop().call_later(INTERRUPT_GRACE, self.give_up_turn, self.waiting)
        else:
            action.cancel()  # a send or a command waiting for the server

    async def _interrupt(self, conv: RemoteConversation, turn: str) -> None:
        try:
            await conv.ainterrupt()
        except ClientError as e:
            self.say(f"[could not interrupt: {e}]")
            self.give_up_turn(turn)

    def give_up_turn(self, turn: str) -> None:
        if self.waiting == turn and not self.turn_over.is_set():
            self.say("[the reply goes on on the server; it shows here when it comes]")
            self.turn_over.set()

    def spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    # --- the conversation ---------------------------------------------------------------------

    async def open(self, conv: RemoteConversation) -> None:
        await self.close_stream()
        previous, self.conv = self.conv, conv
        self.stream = conv.events()  # subscribed now; the history read next is older
        self.ledger = Ledger()
        self.held, self.reply = None, []
        for _record, _turn in self.ledger.follow(await read_history(conv, None)):
            pass  # where the history ends: a later Gap is read from there
        self.printer = asyncio.create_task(self.print_events(self.stream))
        self.say(f"conversation {conv.id}" + (f" ({conv.title})" if conv.title else ""))
        if conv is not previous:
            self.asks, self.asked = asyncio.Queue(), set()
        await self.ask_pending()  # what waited already (a restart, another viewer's turn)

    async def ask_pending(self) -> None:
        """Ask about the approvals that wait in the conversation and were not asked yet."""
        assert self.conv is not None
        for waiting in await self.conv.approvals():
            self.request(waiting)

    def request(self, waiting: PendingApproval) -> None:
        if waiting.call_id not in self.asked:
            self.asked.add(waiting.call_id)
            self.asks.put_nowait(waiting)

    async def close_stream(self) -> None:
        if self.printer is not None:
            self.printer.cancel()
            await asyncio.gather(self.printer, return_exceptions=True)
            self.printer = None
        if self.stream is not None:
            await self.stream.aclose()
            self.stream = None

    async def print_events(self, stream: RemoteEventStream) -> None:
        try:
            async for event in stream:
                if type(event) is Gap:
                    await self.catch_up()
                elif self.held is not None:
                    self.hold(event)
                else:
                    self.show(event)
                if not stream.pending:  # one write for the events that came together
                    self.out.flush()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.say(f"[the event stream failed: {e}]")
        else:
            self.say("[this conversation was deleted]")
        self.turn_over.set()

    def show(self, event: Event) -> None:
        if isinstance(event, AppendText):
            if not event.reasoning:
                self.reply_text(event.text)
                self.reply.append(event.text)
        elif isinstance(event, UserMessage):
            self.show_user(event.id, event.via, event.text)
        elif isinstance(event, End):
            self.end_turn(event.turn_id)
        elif isinstance(event, ApprovalRequested):
            self.request(
                PendingApproval(
                    event.call_id, event.tool_name, event.args_json, event.turn_id, None
                )
            )
        elif isinstance(event, StartReasoning):
            self.say("(thinking…)")
        elif isinstance(event, ToolCall):
            self.ledger.tools.add(event.call_id)
            self.say(f"  tool {event.tool_name}({short(event.args_json, 60)})")
        elif isinstance(event, ToolResult):
            self.ledger.tools.add(event.result_id)
            self.say(f"  {'✗' if event.is_error else '→'} {short(event.text)}")
        elif isinstance(event, Error):
            self.say(f"[error: {event.message}" + (f" ({event.code})]" if event.code else "]"))
        elif isinstance(event, Interrupted):
            self.say("[interrupted]")
        elif isinstance(event, Truncated):
            self.say("[the reply was cut at the length limit]")
        elif isinstance(event, Compacted):
            self.say(f"[context compacted: {event.tokens_before} → {event.tokens_after} tokens]")

    def show_user(self, message_id: str, via: Via | None, text: str) -> None:
        """Another viewer's message (ours was typed here: not shown again)."""
        if message_id in self.ledger.users:
            return
        self.ledger.users.add(message_id)
        if via is not None and via.sender == self.me:
            return
        self.say(f"[{who(via)}] {text}")

    def end_turn(self, turn_id: str | None) -> None:
        if self.mid_line and not self.status_shown:
            self.out.write("\n")
            self.out.flush()
            self.mid_line = False
        self.reply, self.in_reply = [], False
        if turn_id is not None:
            self.ledger.ended.add(turn_id)
        if turn_id is None or turn_id == self.waiting:  # None: a server that does not say
            self.turn_over.set()
        elif not self.at_prompt and (self.action is None or self.action.done()):
            self.prompt()  # another viewer's turn ended while this one was at the prompt

    # --- after a Gap: the history fills in -----------------------------------------------------

    async def catch_up(self) -> None:
        """The server lost events (it restarted, or this chat was away too long): show from
        the history what this chat had not shown, and finish the turn it was waiting for."""
        assert self.conv is not None
        self.held = None
        try:
            records = await read_history(self.conv, self.ledger.mark)
        except ClientError as e:
            self.say(f"[some events were missed; /history shows the conversation ({e})]")
            return
        finished: list[str] = []
        window: set[str] = set(self.ledger.open)
        for record, turn in self.ledger.follow(records):
            if record.kind == "user":
                window.add(record.id)
                self.show_user(record.id, _via(record), user_text(record.payload))
            elif turn is None or turn in self.ledger.ended:
                continue  # shown live already
            elif record.kind in ("tool_call", "tool_result"):
                self.show_tool_record(record)
            elif record.kind in ("assistant", "error"):
                self.show_end_record(record)
                finished.append(turn)
                self.end_turn(turn)
        if finished:  # the replay that follows may repeat those turns: hold it (see hold)
            self.held, self.skip, self.skip_last = [], set(finished), finished[-1]
            self.window = window
        with contextlib.suppress(ClientError):  # a request the lost events carried
            await self.ask_pending()

    def show_tool_record(self, record: Message) -> None:
        p = record.payload
        key = p["callId"] if record.kind == "tool_call" else record.id
        if key in self.ledger.tools:
            return
        self.ledger.tools.add(key)
        self.say(describe_message(record))

    def show_end_record(self, record: Message) -> None:
        """The rest of a turn's reply (what was not streamed here), then how it ended."""
        p = record.payload
        text = p.get("text", "") if record.kind == "assistant" else p.get("partialText", "")
        shown = "".join(self.reply)
        if shown and text.startswith(shown):
            text = text[len(shown) :]
        elif shown:
            self.say()  # a different reply: on a line of its own
        if text:
            self.reply_text(text)
        if record.kind == "error":
            self.say(f"[error: {p.get('message')}" + (f" ({p['code']})]" if p.get("code") else "]"))
        elif p.get("interrupted"):
            self.say("[interrupted]")

    def hold(self, event: Event) -> None:
        """After a catch-up, the stream replays what the restarted server has: events of
        turns the history just showed are dropped, the others shown. Turns never overlap, so
        each held run of events ends with its turn's ``End``."""
        held = self.held
        assert held is not None
        if isinstance(event, UserMessage) and event.id not in self.window:
            self.release()  # accepted after the history was read: the replay is over
            self.show(event)
            return
        held.append(event)
        if not isinstance(event, End):
            return
        if event.turn_id in self.skip:
            held.clear()
            if event.turn_id == self.skip_last:
                self.held = None
        else:
            self.release()

    def release(self) -> None:
        held, self.held = self.held or [], None
        for event in held:
            self.show(event)

    # --- choosing a conversation --------------------------------------------------------------

    async def pick(self, conversation_id: str | None, new: bool) -> None:
        """The conversation to start in: the one named, a new one, or one chosen from a list."""
        if conversation_id:
            conv = await self.agent.get_conversation(conversation_id)
            if conv is None:
                raise ChatError(f"no conversation {conversation_id!r}")
            await self.open(conv)
            return
        # from a pipe there is nobody to ask: a new conversation
        infos = [] if new or self.input.whole else await self.agent.list_conversations(0, LIST_SIZE)
        if infos:
            self.show_list(infos)
            self.say("Pick a number, or press Enter for a new conversation: ", end="")
            line = await self.messages.get()
            if line is None:
                self.leave.set()
                return
            if line.strip().isdigit() and 1 <= int(line) <= len(infos):
                conv = await self.agent.get_conversation(infos[int(line) - 1].id)
                if conv is not None:
                    await self.open(conv)
                    return
        await self.open(await self.agent.create_conversation())

    def show_list(self, infos: list[Any]) -> None:
        for i, info in enumerate(infos, 1):
            when = info.updated_at.strftime("%Y-%m-%d %H:%M")
            self.say(f"  {i:>2}. {info.title or '(untitled)'}  {when}  {info.id}")

    # --- commands -----------------------------------------------------------------------------

    async def command(self, line: str) -> bool:
        """Run a /command; False to leave."""
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        assert self.conv is not None
        if name in ("/quit", "/exit"):
            return False
        if name == "/new":
            await self.open(await self.agent.create_conversation(title=arg or None))
        elif name == "/list":
            infos = await self.agent.list_conversations(0, LIST_SIZE)
            if infos:
                self.show_list(infos)
            else:
                self.say("(no conversations yet)")
        elif name == "/open" and arg:
            try:
                await self.open(await find_conversation(self.agent, arg))
            except LookupError as e:
                self.say(str(e.args[0]))
        elif name == "/rename" and arg:
            await self.conv.rename(arg)
            self.say(f"[renamed: {arg}]")
        elif name == "/history":
            await self.history(self.conv)
        elif name == "/export" and arg:
            await self.export(self.conv, arg)
        else:
            self.say(HELP)
        return True

    async def history(self, conv: RemoteConversation) -> None:
        """The last messages, oldest first (the API pages from the oldest)."""
        messages = (await read_history(conv, None))[-HISTORY_SIZE:]
        for m in messages:
            self.say(describe_message(m))
        if not messages:
            self.say("(no messages yet)")

    async def export(self, conv: RemoteConversation, path: str) -> None:
        """The whole conversation into ``path``: JSON for ``*.json``, else Markdown."""
        text = await conv.export("json" if path.lower().endswith(".json") else "md")
        try:
            await asyncio.to_thread(write_file, path, text)
        except OSError as e:
            self.say(f"[cannot write {path}: {e.strerror or e}]")
            return
        self.say(f"[exported to {path}]")

    # --- the loop -----------------------------------------------------------------------------

    async def run(self, conversation_id: str | None, new: bool) -> None:
        await self.until_leave(self.pick(conversation_id, new))  # Ctrl-C twice leaves it too
        if not self.leave.is_set():
            self.say(HELP)
        while not self.leave.is_set():
            if self.asks.empty():
                self.prompt()
            message = await self.until_leave(self.next_input())
            if message is None:
                break
            self.presses = 0
            if isinstance(message, PendingApproval):
                self.action = asyncio.ensure_future(self.answer_waiting(message))
            elif not message.strip():
                continue
            else:
                self.action = asyncio.ensure_future(self.carry_out(message))
            try:
                if not await self.until_leave(self.action):
                    break
            except asyncio.CancelledError:
                if not self.action.cancelled():
                    raise  # this loop itself is cancelled
                self.say("[cancelled]")
            except ClientError as e:  # the chat goes on: the server may be back soon
                self.say(f"[{e}]")
        self.say("bye")

    async def carry_out(self, message: str) -> bool:
        if message.startswith("/") and "\n" not in message:
            return await self.command(message)
        await self.send(message)
        return True

    async def send(self, text: str) -> None:
        assert self.conv is not None
        if self.printer is None or self.printer.done():  # the stream failed: try again
            await self.open(self.conv)
        self.turn_over.clear()
        self.waiting = None
        msg = await self.conv.send([TextPart(text)])
        self.ledger.users.add(msg.id)
        self.waiting = msg.id
        if msg.id in self.ledger.ended:  # its End came before the answer to the send
            self.turn_over.set()
        try:
            await self.follow_turn()
        finally:
            self.waiting = None

    # --- approvals ----------------------------------------------------------------------------

    async def next_input(self) -> str | PendingApproval | None:
        """What to do next at the prompt: a line typed, or an approval to ask about."""
        if not self.asks.empty():
            return self.asks.get_nowait()
        typed, asked = await first(self.messages.get(), self.asks.get())
        line: str | None = typed.result() if won(typed) else None
        if not won(asked):
            return line
        waiting: PendingApproval = asked.result()
        if won(typed):  # both at once: the line goes first, the question next
            self.asks.put_nowait(waiting)
            return line
        return waiting

    async def follow_turn(self) -> None:
        """Until the turn shown ends, asking about each approval it waits for."""
        while not self.turn_over.is_set():
            asked, _ = await first(self.asks.get(), self.turn_over.wait())
            if won(asked) and not self.turn_over.is_set():
                await self.answer(asked.result())

    async def answer_waiting(self, waiting: PendingApproval) -> bool:
        """At the prompt: a turn waits (found on opening the conversation, or another
        viewer's): ask, then show the turn until it ends."""
        self.turn_over.clear()
        self.waiting = waiting.turn_id
        if waiting.turn_id in self.ledger.ended:
            self.turn_over.set()
        try:
            await self.answer(waiting)
            await self.follow_turn()
        finally:
            self.waiting = None
        return True

    async def answer(self, waiting: PendingApproval) -> None:
        """``Run tool {args}? [y/N/e(dit)]``: y approves; n or Enter denies, with a note if
        the person gives one; e asks for other arguments (JSON; the server checks them against
        the tool's schema) and approves with them. A wrong answer asks again."""
        assert self.conv is not None
        conv, call_id = self.conv, waiting.call_id
        while True:
            self.say(f"Run {waiting.tool_name} {waiting.args_json}? [y/N/e(dit)] ", end="")
            line = await self.read_answer()
            if line is None:
                return
            choice = line.strip().lower()
            if choice in ("y", "yes"):
                await self.settle(conv.approve(call_id), "approved")
                return
            if choice in ("", "n", "no"):
                self.say("Note for the model (Enter: none): ", end="")
                note = await self.read_answer()
                if note is None:
                    return
                await self.settle(conv.deny(call_id, note=note.strip() or None), "denied")
                return
            if choice in ("e", "edit"):
                if await self.edit(waiting):
                    return
                continue
            self.say("[answer y, n or e]")

    async def edit(self, waiting: PendingApproval) -> bool:
        """Other arguments for the call, asked until they are JSON the server takes; False
        when the person gives none (the question is asked again)."""
        assert self.conv is not None
        while True:
            self.say("Arguments as JSON (Enter: back): ", end="")
            line = await self.read_answer()
            if line is None:
                return True
            if not line.strip():
                return False
            try:
                args = json.loads(line)
            except ValueError as e:
                self.say(f"[not JSON: {e}]")
                continue
            if not isinstance(args, dict):
                self.say("[the arguments are a JSON object: {...}]")
                continue
            try:
                await self.conv.approve(waiting.call_id, args=args)
            except APIError as e:
                self.say(f"[{e.message}]")
                if e.status == 400:  # they do not fit the tool: ask again
                    continue
                return True
            self.say(f"[approved with {json.dumps(args, ensure_ascii=False)}]")
            return True

    async def settle(self, answer: Any, said: str) -> None:
        try:
            await answer
        except APIError as e:  # 409: another viewer answered first, or the turn ended
            self.say(f"[{e.message}]")
            return
        self.say(f"[{said}]")

    async def read_answer(self) -> str | None:
        """A line typed in answer; None when the turn ended first (interrupted, or answered
        elsewhere) or the input did (the end stays for the prompt's loop)."""
        typed, _ = await first(self.messages.get(), self.turn_over.wait())
        if not won(typed):
            self.say()
            return None
        line: str | None = typed.result()
        if line is None:
            self.messages.put_nowait(None)
        return line

    async def until_leave(self, work: Any) -> Any:
        """``work``'s result; None when the chat is left first (Ctrl-D, a second Ctrl-C)."""
        task = asyncio.ensure_future(work)
        leave = asyncio.ensure_future(self.leave.wait())
        try:
            await asyncio.wait([task, leave], return_when=asyncio.FIRST_COMPLETED)
        finally:
            leave.cancel()
        if task.done():
            return task.result()
        task.cancel()
        return None


async def first(*works: Any) -> list[asyncio.Future[Any]]:
    """Run ``works`` until one is done; the others are cancelled (a ``Queue.get`` cancelled
    takes nothing out). Their futures, in order: :func:`won` says which finished."""
    tasks = [asyncio.ensure_future(w) for w in works]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
    return tasks


def won(task: asyncio.Future[Any]) -> bool:
    return task.done() and not task.cancelled()


def write_file(path: str, text: str) -> None:
    Path(path).expanduser().write_text(text, encoding="utf-8")


def _via(record: Message) -> Via | None:
    raw = record.payload.get("via")
    return None if raw is None else Via.from_json(raw)


# --- the command --------------------------------------------------------------------------------


async def check_server(agent: RemoteAgent) -> None:
    """At once, not after retries: is there an agentik server, and does it take our key?"""
    url = agent.url
    try:
        await agent.request("GET", "/conversations", params={"limit": 1}, retry=False)
    except ConnectionFailed:
        raise ChatError(
            f"no agentik server at {url} — start one with 'make serve' or 'agentik serve', "
            "or pass --url"
        ) from None
    except Unauthorized as e:
        raise ChatError(
            f"{url} refused the API key ({e.message}): give --key or AGENTIK_API_KEY"
        ) from None
    except APIError as e:
        raise ChatError(f"{url} does not answer as an agentik server: {e}") from None


@contextlib.contextmanager
def terminal(fd: int, out: TextIO) -> Iterator[bool]:
    """Bracketed paste on, and escape characters echoed as they are (not as ``^[``), while the
    chat runs in a terminal; yields whether it is one."""
    if not os.isatty(fd):
        yield False
        return
    import termios

    saved = termios.tcgetattr(fd)
    changed = list(saved)
    changed[3] &= ~getattr(termios, "ECHOCTL", 0)
    termios.tcsetattr(fd, termios.TCSANOW, changed)
    if out.isatty():
        out.write(PASTE_ON)
        out.flush()
    try:
        yield True
    finally:
        if out.isatty():
            out.write(PASTE_OFF)
            out.flush()
        termios.tcsetattr(fd, termios.TCSANOW, saved)


async def chat(url: str, key: str | None, conversation_id: str | None, new: bool) -> None:
    """Raises :class:`ChatError` with the line to print when it cannot start or go on."""
    loop = asyncio.get_running_loop()
    me = f"chat-{secrets.token_hex(3)}"
    try:
        agent = RemoteAgent(url, api_key=key, retry_for=None, sender=me)
    except ClientError as e:  # a bad URL or AGENTIK_API_KEY
        raise ChatError(str(e)) from None
    fd = sys.stdin.fileno()
    async with agent:
        await check_server(agent)
        with terminal(fd, sys.stdout) as typed:
            session = Chat(agent, tty=sys.stdout.isatty(), me=me)
            session.input = Input(whole=not typed)  # a pipe's whole input is one message
            agent.on_retry = session.on_retry
            try:
                loop.add_reader(fd, session.on_input, fd)
            except OSError:  # a regular file: epoll cannot watch it
                raise ChatError("agentik chat reads a terminal or a pipe") from None
            loop.add_signal_handler(signal.SIGINT, session.on_interrupt)
            try:
                await session.run(conversation_id, new)
            except APIError as e:
                raise ChatError(str(e)) from None
            finally:
                loop.remove_signal_handler(signal.SIGINT)
                loop.remove_reader(fd)
                await session.close_stream()


def chat_command(url: str | None, key: str | None, conversation_id: str | None, new: bool) -> None:
    """``agentik chat``; ``url`` None: :func:`default_url`."""
    asyncio.run(chat(url or default_url(), key, conversation_id, new))


async def export(url: str, key: str | None, conversation: str, form: ExportFormat) -> str:
    try:
        agent = RemoteAgent(url, api_key=key)
    except ClientError as e:
        raise ChatError(str(e)) from None
    async with agent:
        await check_server(agent)
        try:
            conv = await find_conversation(agent, conversation)
            return await conv.export(form)
        except LookupError as e:
            raise ChatError(str(e.args[0])) from None
        except ClientError as e:
            raise ChatError(f"{url}: {e}") from None


def export_command(url: str | None, key: str | None, conversation: str, form: ExportFormat) -> None:
    """``agentik export``: the conversation (named as ``/open`` names one) on stdout."""
    sys.stdout.write(asyncio.run(export(url or default_url(), key, conversation, form)))
    sys.stdout.flush()
