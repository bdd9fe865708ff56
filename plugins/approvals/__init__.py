"""Tool approvals: which tool calls wait for a person's yes or no before they run.

``AGENTIK_TOOL_APPROVAL``: ``off`` (the default), ``all``, ``destructive`` (tools that say they
change or delete what they reach: MCP's ``destructiveHint``), or a comma list of tool names and
globs (``mcp_fs__write_*,memory_delete``), which may include ``destructive``. A tool made with
``@tool(requires_approval=True)`` always waits. ``AGENTIK_APPROVAL_TIMEOUT``: seconds after
which a request nobody answered is denied (none by default: it waits, across restarts too).

The waiting itself is the core's (agentik.core.turns, agentik.core.approvals): this plugin is
the policy (a ``tool_call_gate``) and the timeout; ``docs/approvals.md`` has the whole story.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from agentik.core import approvals
from agentik.core.settings import Setting, Settings
from agentik.hookspecs import hookimpl
from agentik_approvals.policy import Policy, parse_policy

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent
    from agentik.core.conversation import ChatConversation
    from agentik.core.llm import ToolCallRequest
    from agentik.core.turns import Wait

STATE = "agentik_approvals"  # agent.state key: the policy


def parse_timeout(raw: str) -> float | None:
    if raw.strip().lower() in ("", "none", "off", "0"):
        return None
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"{raw!r} is not a number of seconds") from None
    if seconds <= 0:
        raise ValueError("must be more than 0 seconds (or none)")
    return seconds


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    register(
        Setting(
            "AGENTIK_TOOL_APPROVAL",
            Policy(),
            parse_policy,
            "Tool calls that wait for a person's approval: off, all, destructive (MCP's "
            "destructiveHint), or a comma list of tool names and globs (e.g. "
            "mcp_fs__write_*,memory_delete). Tools made with requires_approval always wait.",
        )
    )
    register(
        Setting(
            "AGENTIK_APPROVAL_TIMEOUT",
            None,
            parse_timeout,
            "Seconds after which an approval nobody answered is denied; unset: it waits (across "
            "restarts too).",
        )
    )


@hookimpl
def register_services(register: Callable[..., None], agent: ChatAgent, settings: Settings) -> None:
    agent.state[STATE] = settings["AGENTIK_TOOL_APPROVAL"]


@hookimpl
def tool_call_gate(conversation: ChatConversation, call: ToolCallRequest) -> Wait | None:
    policy: Policy | None = conversation.agent.state.get(STATE)
    if policy is None:
        return None
    if policy.holds(call.name, conversation.agent.tools.get(call.name)):
        return approvals.request(call)
    return None


@hookimpl
def register_jobs(register: Callable[..., None], agent: ChatAgent, settings: Settings) -> None:
    timeout = settings["AGENTIK_APPROVAL_TIMEOUT"]
    if timeout is None:
        return
    from agentik_approvals.expiry import deny_expired

    register("approval-timeout", lambda: deny_expired(agent, timeout), interval=min(timeout, 30.0))


@hookimpl
def banner_lines(agent: ChatAgent, settings: Settings) -> list[str]:
    policy: Policy = settings["AGENTIK_TOOL_APPROVAL"]
    timeout = settings["AGENTIK_APPROVAL_TIMEOUT"]
    waits = f", denied after {timeout:g} s without an answer" if timeout else ""
    return [f"approvals: {policy.describe()}{waits}"]
