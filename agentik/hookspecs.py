"""The hooks agentik plugins implement. Full reference: ``docs/plugin_hooks.md``.

Every hook is synchronous (pluggy awaits nothing): hooks register or configure, and the objects
they register are async. Never write an ``async def`` hookimpl. An implementation may accept any
subset of a hook's parameters.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent
    from agentik.core.conversation import ChatConversation
    from agentik.core.llm import HistoryItem, ToolCallRequest
    from agentik.core.observe import Observer
    from agentik.core.registry import Register
    from agentik.core.settings import Setting, Settings
    from agentik.core.tools import Tool, ToolSpec
    from agentik.core.turns import TurnRecord, Wait

PROJECT = "agentik"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# --- configuration ------------------------------------------------------------------------


@hookspec
def register_settings(register: Callable[[Setting], None]) -> None:
    """Declare the environment variables this plugin reads.

    Called once, before anything else is built. Every declared variable is parsed and validated
    at start-up (blank means default; invalid stops start-up naming the variable) and listed by
    ``agentik plugins`` and the docs.

    :param register: ``register(Setting(name, default, parse, help))``.
    """


# --- backends: registered by name, one chosen by an AGENTIK_* variable --------------------


@hookspec
def register_llm_backends(register: Register) -> None:
    """Register LLM backends by name.

    ``register("openai", factory, aliases=(), requires=("openai",))``: ``factory(settings)``
    returns an :class:`agentik.core.llm.LLMBackend` and is called only when
    ``AGENTIK_LLM_BACKEND`` names this backend or one of its aliases. ``requires`` lists the
    modules the backend imports, so a missing extra is reported before the factory runs.
    """


@hookspec
def register_memory_backends(register: Register) -> None:
    """Register long-term memory backends by name (chosen by ``AGENTIK_MEMORY_BACKEND``).

    Same ``register(name, factory, aliases=(), requires=())`` contract as
    :func:`register_llm_backends`; the factory receives the settings, and also ``embedding``
    (the selected embedding backend, built only then) and ``store`` (the agent's store) when
    it has parameters of those names.
    """


@hookspec
def register_embedding_backends(register: Register) -> None:
    """Register embedding backends by name (chosen by ``AGENTIK_EMBEDDING_BACKEND``).

    Same ``register(name, factory, aliases=(), requires=())`` contract as
    :func:`register_llm_backends`; the factory receives the settings and returns an
    :class:`agentik.core.embedding.EmbeddingBackend`. It is built only for a memory backend
    whose factory takes ``embedding``.
    """


# --- contributions: every implementation adds something ----------------------------------


@hookspec
def register_transports(register: Callable[..., None]) -> None:
    """Contribute routes or sub-applications to the one aiohttp server.

    ``register(name, setup)``: ``setup(app, agent, settings)`` is called inside the app
    factory, before the server starts, and adds routes, sub-apps, ``on_shutdown`` or
    ``cleanup_ctx`` entries to ``app`` (a :class:`aiohttp.web.Application`).
    """


@hookspec
def register_tools(register: Callable[[Tool], None], settings: Settings) -> None:
    """Contribute in-agent tools the model may call.

    :param register: ``register(tool)`` with an :class:`agentik.core.tools.Tool` (see the
        ``agentik.core.tools.tool`` decorator). A name used twice stops start-up.
    :param settings: the parsed settings.
    """


@hookspec
def register_prompt_sections(register: Callable[..., None], settings: Settings) -> None:
    """Contribute sections of the system prompt.

    ``register(name, render, order=100)``: ``render(agent)`` (or ``render()``, when it takes
    no argument) returns the section's text (or ``None`` to leave it out); the agent gives it
    the state its plugin keeps in ``agent.state``. It is called before every turn (keep it
    cheap): a section whose text changed reaches each conversation at its next turn (the
    backend swaps the system prompt, or the live LLM conversation is rebuilt). Sections are
    joined by blank lines, lowest ``order`` first: the persona uses 0, the base prompt 100.
    """


@hookspec
def register_services(register: Callable[..., None], agent: ChatAgent, settings: Settings) -> None:
    """Contribute long-lived resources that live as long as the server (MCP sessions, clients).

    ``register(name, context)``: ``context()`` returns an async context manager. It is entered
    at start-up, in registration order, after the database is open and before requests are
    served; it is exited at shutdown, in reverse order, after running turns have stopped. A
    service that raises while starting stops start-up with its name. Tools it discovers while
    starting can be added with ``agent.tools.add(tool)``.
    """


@hookspec
def register_jobs(register: Callable[..., None], agent: ChatAgent, settings: Settings) -> None:
    """Contribute background jobs.

    ``register(name, run, interval=None)``: ``run()`` returns an awaitable. With ``interval``
    (seconds) it is run repeatedly, first after one interval; without, once at start-up. Jobs
    never block a turn, their failures are logged, and they are cancelled at shutdown. With
    many instances on one PostgreSQL a periodic job runs on one instance at a time (a lock per
    job ``name``; another instance takes it over when that one stops); a start-up one runs on
    each instance.
    """


@hookspec
def register_commands(register: Callable[..., None]) -> None:
    """Contribute ``agentik <name>`` sub-commands of the command line.

    ``register(name, setup, run, help="")``: ``setup(parser)`` adds the command's arguments
    to its :class:`argparse.ArgumentParser`; ``run(args, settings)`` runs it with the parsed
    arguments and the settings and returns the exit status. A ``SettingsError`` it raises is
    shown as one line (exit 2). Plugins are loaded for these only when the command line names
    a command that is not a core one, so ``agentik serve`` and ``--help`` pay nothing for them.
    """


@hookspec
def register_observers(
    register: Callable[[Observer], None], agent: ChatAgent, settings: Settings
) -> None:
    """Watch what turns do: traces, metrics, logs (``agentik.core.observe``).

    ``register(observer)`` with an :class:`agentik.core.observe.Observer`: it is told when a send
    is queued and when each span starts and ends (a turn, a model call, a tool call, a
    compaction, a plugin's ``before_turn`` work, a background model call). Called once at
    start-up, after the agent is built. Register nothing when your feature is off: with no
    observer the core skips every observation point.
    """


# --- turn lifecycle -----------------------------------------------------------------------


@hookspec
def before_turn(conversation: ChatConversation, text: str) -> str | Awaitable[str | None] | None:
    """Called when a turn starts, before the user's text goes to the model.

    Return text (or an awaitable of text) to put before the user's text in what the model sees
    (for example a ``[Memory context …]`` block), or ``None``. Results are joined in hook order.

    :param conversation: the conversation running the turn.
    :param text: the user's text as the model will see it (context prefix included).
    """


@hookspec
def after_turn(
    conversation: ChatConversation, user_text: str, assistant_text: str
) -> Awaitable[Any] | None:
    """Called after a turn's assistant message is recorded (not after failed turns).

    Return an awaitable to run it as a background job (memory review, reflection, mining); it
    never delays the conversation and its failure is logged.
    """


@hookspec
def before_compaction(
    conversation: ChatConversation, items: list[HistoryItem]
) -> Awaitable[Any] | None:
    """Called when working memory is about to be compacted, with the entries that will be
    summarised away (the oldest turns).

    Return an awaitable to look at them first (the memory feature saves durable facts from them
    with source ``PRE_COMPACTION``). The compaction runs the returned awaitables beside its
    summary call and waits for them; a failure is logged and does not stop the compaction.
    """


@hookspec
def tool_call_gate(conversation: ChatConversation, call: ToolCallRequest) -> Wait | None:
    """Called for each tool call the model makes, before it runs: return a
    :class:`~agentik.core.turns.Wait` to hold the call until someone answers it.

    The step's calls are recorded, and its turn waits (``waiting``, durable across restarts,
    holding no task) until every held call has an answer through
    ``conversation.resume_turn(turn_id, call_id, answer)`` — from any transport, any time
    later. Then the step goes on: each held call as :func:`tool_call_answer` says, the others
    as the model made them. ``Wait(call_id, kind, request)``: ``kind`` names what asks (your
    plugin's word, e.g. ``"approval"``), ``request`` (JSON) is what clients are shown; the
    ``call_id`` is set for you. The first implementation that returns a wait holds the call;
    one that raises is logged and holds nothing. Runs on the turn path: keep it cheap.
    """


@hookspec
def turn_tools(conversation: ChatConversation, turn: TurnRecord) -> list[ToolSpec] | None:
    """Called when a turn starts, and when it is taken up again (after a wait, after a
    restart): the tools to offer the model for this turn only, beside the agent's own —
    tools someone outside the agent runs (an AG-UI front end's ``RunAgentInput.tools``).

    The agent never runs them: a call to one is held at once (a
    :class:`~agentik.core.turns.Wait` of kind ``client_tool``, ``request``: ``toolName``,
    ``argsJson``; no ``tool_call_gate`` is asked, so no approval either) and the turn waits,
    durably, until whoever offered it answers with its result through
    ``conversation.resume_turn(turn_id, call_id, {"result": text, "isError": bool})``. Return
    the same tools for the same turn every time (keep them with the turn, e.g. in its user
    message's ``context.metadata``): a turn resumed after a restart asks again. A name the
    agent's own tools use is left out (logged). Runs on the turn path: keep it cheap.
    """


@hookspec
def tool_call_answer(
    conversation: ChatConversation, call: ToolCallRequest, wait: Wait
) -> ToolCallRequest | tuple[str, bool] | None:
    """Called for each held call once its step goes on, with its answered ``wait``
    (``wait.answer``): return the call to run (the model's, or one with other arguments) or
    a result ``(text, is_error)`` the model gets instead of running it; ``None`` leaves it to
    the next implementation, then to the default: an ``approval`` wait goes as the person
    answered; an answer that is text, or ``{"result": text, "isError": bool}``, is the call's
    result; a ``client_tool`` wait answered otherwise is an error result; any other lets it run.
    """


@hookspec(firstresult=True)
def compact_context(
    conversation: ChatConversation, context_tokens: int, forced: bool
) -> Awaitable[Any] | None:
    """Called before each send to the model (every step of a turn) with the running estimate
    of the live context in tokens: system prompt + working memory + tool schemas + the step's
    new input (``agentik.core.context``; the backend's own count where it reports one).

    Return an awaitable to compact first: it calls ``conversation.compact(summarize)``, the
    core's atomic operation, and the turn engine then rebuilds the live LLM conversation before
    sending. Return ``None`` to send as is. ``forced`` is True when the endpoint has just
    refused the step as too long (``LLMError.code == CONTEXT_LENGTH``): the step is retried
    once if a compaction happened. The first implementation that returns an awaitable wins;
    a failure is logged and the turn goes on. Must be cheap: it runs on every send.
    """


# --- operations ---------------------------------------------------------------------------


@hookspec
def plugin_details(settings: Settings) -> dict[str, Any] | Awaitable[dict[str, Any]] | None:
    """What ``agentik plugins`` shows about this plugin's state beyond its hooks and settings.

    Return a JSON-able dict (or an awaitable of one), e.g. each MCP server of ``mcp.json``, whether
    it starts and its tools. It runs in the ``plugins`` command, without a server: start and
    stop what you need to find out, within about 60 s.
    """


@hookspec
def register_debug_actions(
    register: Callable[..., None], agent: ChatAgent, settings: Settings
) -> None:
    """Offer an action of the debug endpoints (the ``debug`` plugin, with
    ``AGENTIK_DEBUG_ENDPOINTS=1``), run by ``POST /debug/<name>``.

    ``register(name, run, *, conversation=True, off=None)``: ``run(conversation)`` (``run()``
    with ``conversation=False``) returns an awaitable of a JSON-able dict saying what it did;
    with ``conversation=True`` the request names it with ``?conversationId=``. A feature that
    is off registers ``run=None`` with ``off`` naming the variable that turns it on: the
    endpoint answers 409 naming it. Called on each debug request, after start-up.
    """


@hookspec
def banner_lines(agent: ChatAgent, settings: Settings) -> list[str] | None:
    """Lines for the start-up banner (``mcp: 4 tools from 2 servers``), printed by ``serve``."""
