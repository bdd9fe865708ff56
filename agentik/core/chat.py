"""``agentik chat``: a terminal chat with a running agentik, on :mod:`agentik.client`.

Lines come from the terminal as it hands them over (its own line editing), Ctrl-C arrives as
SIGINT on the event loop: the first one stops the reply being streamed, a second one leaves.
One event stream per conversation prints every turn's text as it arrives.
"""

from __future__ import annotations

import asyncio
import codecs
import os
import signal
import sys
from typing import Any, TextIO

from agentik.client import ClientError, RemoteAgent, RemoteConversation, RemoteEventStream
from agentik.core.types import (
    AppendText,
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
)

HELP = "Type a message. /new, /list, /open N, /history, /quit. Ctrl-C stops a reply, twice leaves."
LIST_SIZE = 10
HISTORY_SIZE = 20
SHORT = 80


def short(text: str, limit: int = SHORT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_message(m: Message) -> str:
    """One line of ``/history``."""
    p = m.payload
    if m.kind == "user":
        text = " ".join(part.get("body", "[image]") for part in p.get("content", []))
        return f"you: {text}"
    if m.kind == "assistant":
        return f"agent: {p.get('text', '')}" + (" [interrupted]" if p.get("interrupted") else "")
    if m.kind == "tool_call":
        return f"  tool {p.get('toolName')}({short(p.get('argsJson', ''), 60)})"
    if m.kind == "tool_result":
        mark = "✗" if p.get("isError") else "→"
        return f"  {mark} {short(p.get('text', ''))}"
    if m.kind == "error":
        return f"[error: {p.get('message')} ({p.get('code')})]"
    return f"[{m.kind}: {short(p.get('text', ''))}]"


class Chat:
    def __init__(self, agent: RemoteAgent, out: TextIO = sys.stdout) -> None:
        self.agent = agent
        self.out = out
        self.conv: RemoteConversation | None = None
        self.stream: RemoteEventStream | None = None
        self.printer: asyncio.Task[None] | None = None
        self.lines: asyncio.Queue[str | None] = asyncio.Queue()
        self.turn_over = asyncio.Event()
        self.turn_over.set()
        self.presses = 0  # Ctrl-C since the last line typed
        self.leave = asyncio.Event()
        self.pending = ""  # a line being typed (what the terminal handed over so far)
        # a character may be split between two reads of a pipe
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.mid_line = False  # the agent's text left the cursor mid-line
        self.interrupting: asyncio.Future[None] | None = None

    def say(self, text: str = "", end: str = "\n") -> None:
        if self.mid_line:
            self.out.write("\n")
            self.mid_line = False
        self.out.write(text + end)
        self.out.flush()

    # --- terminal input -----------------------------------------------------------------------

    def on_input(self, fd: int) -> None:
        data = os.read(fd, 4096)
        if not data:
            # end of input (Ctrl-D): a pipe at its end stays readable, so stop watching it
            asyncio.get_running_loop().remove_reader(fd)
            last = self.pending + self.decoder.decode(b"", final=True)
            if last.strip():  # a last line without its newline
                self.lines.put_nowait(last.rstrip("\r"))
            self.lines.put_nowait(None)
            return
        self.pending += self.decoder.decode(data)
        *complete, self.pending = self.pending.split("\n")
        for line in complete:
            self.lines.put_nowait(line.rstrip("\r"))

    def on_interrupt(self) -> None:
        self.presses += 1
        if self.presses >= 2:
            self.leave.set()
        elif not self.turn_over.is_set() and self.conv is not None:
            self.interrupting = asyncio.ensure_future(self._interrupt(self.conv))
        else:
            self.say("(Ctrl-C again or /quit to leave)")
            self.prompt()

    async def _interrupt(self, conv: RemoteConversation) -> None:
        try:
            await conv.ainterrupt()
        except Exception as e:
            self.say(f"[could not interrupt: {e}]")

    def prompt(self) -> None:
        self.say("you> ", end="")

    # --- the conversation ---------------------------------------------------------------------

    async def open(self, conv: RemoteConversation) -> None:
        await self.close_stream()
        self.conv = conv
        self.stream = conv.events()
        self.printer = asyncio.create_task(self.print_events(self.stream))
        self.say(f"conversation {conv.id}" + (f" ({conv.title})" if conv.title else ""))

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
                self.show(event)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.say(f"[the event stream failed: {e}]")
            self.turn_over.set()

    def show(self, event: Event) -> None:
        if isinstance(event, AppendText):
            if event.reasoning:
                return
            if not self.mid_line:
                self.out.write("agent> ")
            self.out.write(event.text)
            self.out.flush()
            self.mid_line = not event.text.endswith("\n")
        elif isinstance(event, StartReasoning):
            self.say("(thinking…)")
        elif isinstance(event, ToolCall):
            self.say(f"  tool {event.tool_name}({short(event.args_json, 60)})")
        elif isinstance(event, ToolResult):
            self.say(f"  {'✗' if event.is_error else '→'} {short(event.text)}")
        elif isinstance(event, Error):
            self.say(f"[error: {event.message}" + (f" ({event.code})]" if event.code else "]"))
        elif isinstance(event, Interrupted):
            self.say("[interrupted]")
        elif isinstance(event, Truncated):
            self.say("[the reply was cut at the length limit]")
        elif isinstance(event, Compacted):
            self.say(f"[context compacted: {event.tokens_before} → {event.tokens_after} tokens]")
        elif isinstance(event, Gap):
            self.say("[some events were missed; /history shows the conversation]")
        elif isinstance(event, End):
            if self.mid_line:
                self.out.write("\n")
                self.mid_line = False
            self.turn_over.set()

    async def pick(self, conversation_id: str | None, new: bool) -> None:
        """The conversation to start in: the one named, a new one, or one chosen from a list."""
        if conversation_id:
            conv = await self.agent.get_conversation(conversation_id)
            if conv is None:
                raise LookupError(f"no conversation {conversation_id!r}")
            await self.open(conv)
            return
        infos = [] if new else await self.agent.list_conversations(0, LIST_SIZE)
        if infos:
            self.show_list(infos)
            self.say("Pick a number, or press Enter for a new conversation: ", end="")
            line = await self.lines.get()
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

    async def command(self, line: str) -> bool:
        """Run a /command; False to leave."""
        name, _, arg = line.partition(" ")
        if name in ("/quit", "/exit"):
            return False
        if name == "/new":
            await self.open(await self.agent.create_conversation(title=arg.strip() or None))
        elif name == "/list":
            infos = await self.agent.list_conversations(0, LIST_SIZE)
            if infos:
                self.show_list(infos)
            else:
                self.say("(no conversations yet)")
        elif name == "/open":
            await self.open_listed(arg.strip())
        elif name == "/history":
            assert self.conv is not None
            await self.history(self.conv)
        else:
            self.say(HELP)
        return True

    async def open_listed(self, arg: str) -> None:
        infos = await self.agent.list_conversations(0, LIST_SIZE)
        chosen = infos[int(arg) - 1].id if arg.isdigit() and 0 < int(arg) <= len(infos) else arg
        conv = await self.agent.get_conversation(chosen) if chosen else None
        if conv is None:
            self.say("usage: /open N (a number from /list) or /open <conversation id>")
        else:
            await self.open(conv)

    async def history(self, conv: RemoteConversation) -> None:
        """The last messages, oldest first (the API pages from the oldest)."""
        messages: list[Message] = []
        after: str | None = None
        while True:
            page = await conv.get_messages(after, 0, 200)
            messages = (messages + page)[-HISTORY_SIZE:]
            if len(page) < 200:
                break
            after = page[-1].id
        for m in messages:
            self.say(describe_message(m))
        if not messages:
            self.say("(no messages yet)")

    async def run(self, conversation_id: str | None, new: bool) -> None:
        await self.pick(conversation_id, new)
        self.say(HELP)
        while not self.leave.is_set():
            self.prompt()
            line = await self.next_line()
            if line is None:
                break
            self.presses = 0
            line = line.strip()
            if not line:
                continue
            try:
                if line.startswith("/"):
                    if not await self.command(line):
                        break
                    continue
                assert self.conv is not None
                self.turn_over.clear()
                await self.conv.send([TextPart(line)])
                await self.wait_turn()
            except ClientError as e:  # the session goes on: the server may be back soon
                self.say(f"[{e}]")
                self.turn_over.set()
        self.say("bye")

    async def next_line(self) -> str | None:
        """The next typed line; None to leave (Ctrl-D, a second Ctrl-C)."""
        get = asyncio.ensure_future(self.lines.get())
        leave = asyncio.ensure_future(self.leave.wait())
        await asyncio.wait([get, leave], return_when=asyncio.FIRST_COMPLETED)
        leave.cancel()
        if get.done():
            return get.result()
        get.cancel()
        return None

    async def wait_turn(self) -> None:
        done = asyncio.ensure_future(self.turn_over.wait())
        leave = asyncio.ensure_future(self.leave.wait())
        await asyncio.wait([done, leave], return_when=asyncio.FIRST_COMPLETED)
        done.cancel()
        leave.cancel()


async def chat(url: str, key: str | None, conversation_id: str | None, new: bool) -> int:
    from agentik.client import APIError, ConnectionFailed, Unauthorized
    from agentik.core.errors import fail

    loop = asyncio.get_running_loop()
    try:
        agent = RemoteAgent(url, api_key=key, retry_for=5.0)
    except ClientError as e:  # a bad URL or AGENTIK_API_KEY
        return fail(str(e))
    async with agent:
        session = Chat(agent)
        fd = sys.stdin.fileno()
        try:
            loop.add_reader(fd, session.on_input, fd)
        except OSError:  # a regular file: epoll cannot watch it
            return fail("agentik chat reads a terminal or a pipe")
        loop.add_signal_handler(signal.SIGINT, session.on_interrupt)
        try:
            await session.run(conversation_id, new)
        except Unauthorized as e:
            return fail(f"{url} refused the API key ({e.message}): give --key or AGENTIK_API_KEY")
        except ConnectionFailed as e:
            return fail(f"cannot reach {url}: {e}")
        except (ClientError, LookupError) as e:
            return fail(str(e) if isinstance(e, LookupError | APIError) else f"{url}: {e}")
        finally:
            loop.remove_signal_handler(signal.SIGINT)
            loop.remove_reader(fd)
            await session.close_stream()
    return 0


def chat_command(url: str, key: str | None, conversation_id: str | None, new: bool) -> int:
    return asyncio.run(chat(url, key, conversation_id, new))
