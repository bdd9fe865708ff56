"""One way for the agent to ask the model a one-shot question: every call it makes for itself
(memory review, reflection, skill mining, compaction summaries) goes through :func:`ask`.

- Each call carries its own output cap (``max_tokens``; a JSON answer needs a few hundred
  tokens), whatever ``OPENAI_MAX_TOKENS`` says: a small local model that does not stop would
  otherwise generate until its context is full, minutes on a CPU.
- The transcript a prompt quotes is fitted to the model's context window (:func:`fit_entries`:
  long entries shortened, then the oldest left out), so the call is not refused for its size.
- Its token counts are recorded per feature (``GET /agentik/stats``, ``background``), and
  calibrate the agent's token estimates (``agent.token_scale``).

Memory review, reflection and skill mining ask for an answer of a fixed JSON shape
(:func:`ask_json`). Models wrap JSON in code fences, put prose around it, or answer something
else entirely; :func:`parse_json_answer` finds the JSON value in such a reply, and a bad answer
is one log line and ``None``, never an exception in a background job.

``transcript_entries`` and ``item_entries`` turn audit-log records and working-memory entries
into the transcript those prompts quote.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from agentik.core.context import MESSAGE_TOKENS, estimate_tokens
from agentik.core.llm import Completion, HistoryItem, LLMError

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent
    from agentik.core.types import Message

log = logging.getLogger(__name__)
T = TypeVar("T")

#: appended to every prompt that expects JSON
JSON_ONLY = "Answer with the JSON object only: no code fences, no text before or after it."
#: the output cap of a JSON answer (memory review, reflection)
JSON_MAX_TOKENS = 400
#: with a known context window, no call's cap takes more than this share of it
MAX_CAP_SHARE = 4
#: the least room a transcript may be fitted into, in tokens; less: the call is not made
MIN_TRANSCRIPT_TOKENS = 48
#: the ``LLMError.code`` of a prompt that cannot fit the context window
PROMPT_TOO_LONG = "prompt_too_long"

_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n(.*?)```", re.DOTALL)
_DECODER = json.JSONDecoder()


class BadAnswer(ValueError):
    """The model's answer holds no JSON value of the expected shape."""


def parse_json_answer(text: str) -> Any:
    """The JSON value in a model's answer: the whole text, else a fenced block, else the first
    ``{…}`` or ``[…]`` that parses. Raises :class:`BadAnswer` when there is none."""
    stripped = text.strip()
    candidates = [stripped, *(m.group(1).strip() for m in _FENCE.finditer(text))]
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError:
            pass
    # prose around the value: try each opening bracket until one decodes
    for match in re.finditer(r"[{\[]", stripped):
        try:
            value, _end = _DECODER.raw_decode(stripped, match.start())
        except ValueError:
            continue
        return value
    raise BadAnswer(f"no JSON in the answer: {_preview(text)}")


def _preview(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "…"


Prompt = str | Callable[[str], str]


def output_cap(agent: ChatAgent, max_tokens: int) -> int:
    """``max_tokens``, but no more than a quarter of a known context window."""
    window = agent.llm.context_window
    return min(max_tokens, max(window // MAX_CAP_SHARE, 16)) if window else max_tokens


def fit_entries(entries: Sequence[str], budget: int, scale: Callable[[int], int] = int) -> str:
    """The transcript of ``entries`` (oldest first) in at most ``budget`` tokens (as
    ``scale(estimate_tokens(...))`` counts them): entries longer than a quarter of the budget
    are shortened to it, then the oldest are left out (one line says how many)."""
    cost = [scale(estimate_tokens(e)) + 1 for e in entries]
    if sum(cost) <= budget:
        return "\n".join(entries)
    longest = max(budget // 4, 16)
    entries = [
        _cut(e, max(1, len(e) * longest // c)) if c > longest else e
        for e, c in zip(entries, cost, strict=True)
    ]
    kept: list[str] = []
    room = budget - 12  # the line that says what was left out
    for entry in reversed(entries):
        room -= scale(estimate_tokens(entry)) + 1
        if room < 0 and kept:
            break
        kept.append(entry)
    left_out = len(entries) - len(kept)
    head = [f"[{left_out} earlier entries left out]"] if left_out else []
    return "\n".join([*head, *reversed(kept)])


async def ask(
    agent: ChatAgent,
    prompt: Prompt,
    *,
    feature: str,
    max_tokens: int,
    transcript: Sequence[str] | None = None,
    system_prompt: str | None = None,
    conversation_id: str | None = None,
) -> Completion:
    """Ask the agent's model ``prompt`` once; raises :class:`LLMError`.

    With a ``transcript`` (entries, oldest first), ``prompt`` is a function of the transcript's
    text that returns the prompt, and the transcript is fitted to the context window around the
    rest of the prompt and the answer's room. ``max_tokens`` caps the answer (at most a quarter
    of a known window). The counts are recorded under ``feature`` (a stats key such as
    ``memory_review``) and ``conversation_id``."""
    llm, scale = agent.llm, agent.token_scale
    cap = output_cap(agent, max_tokens)
    build: Callable[[str], str] = prompt if callable(prompt) else (lambda _t: prompt)
    framing = estimate_tokens(system_prompt or "") + 3 * MESSAGE_TOKENS
    text = build("")
    if transcript is not None:
        window = llm.context_window
        if window:
            fixed = scale(estimate_tokens(text) + framing)
            budget = window - cap - fixed - window // 20  # 5%: the estimate's error
            if budget < MIN_TRANSCRIPT_TOKENS:
                raise LLMError(
                    f"the {feature} prompt leaves no room for its transcript in the model's "
                    f"context window ({window} tokens)",
                    PROMPT_TOO_LONG,
                )
            text = build(fit_entries(transcript, budget, scale))
        else:
            text = build("\n".join(transcript))
    sent = estimate_tokens(text) + framing  # unscaled
    answer = await llm.one_shot(text, system_prompt=system_prompt, max_tokens=cap)
    usage = answer.usage
    if usage is not None and usage.input_tokens is not None and not usage.estimated:
        scale.observe(sent, usage.input_tokens)
        output = usage.output_tokens
        if output is None:
            output = estimate_tokens(answer.text)
        counts = (usage.input_tokens, output, False)
    else:
        counts = (scale(sent), estimate_tokens(answer.text), True)
    try:
        await agent.store.add_background_usage(feature, conversation_id, *counts)
    except Exception:
        log.warning("the token counts of a %s call were not recorded", feature, exc_info=True)
    return answer


async def ask_json(
    agent: ChatAgent,
    prompt: Prompt,
    validate: Callable[[Any], T],
    *,
    feature: str,
    purpose: str | None = None,
    max_tokens: int = JSON_MAX_TOKENS,
    transcript: Sequence[str] | None = None,
    system_prompt: str | None = None,
    conversation_id: str | None = None,
) -> T | None:
    """:func:`ask` for a JSON answer (:data:`JSON_ONLY` is appended to the prompt); returns
    ``validate(value)``.

    ``validate`` receives the parsed JSON and returns the typed answer or raises ``ValueError``
    (or ``TypeError``/``KeyError``) when the shape is wrong. A failed call, an answer without
    JSON or of the wrong shape is logged as a warning naming ``purpose`` and gives ``None``.
    """
    purpose = purpose or feature
    build: Callable[[str], str] = prompt if callable(prompt) else (lambda _t: prompt)
    try:
        answer = await ask(
            agent,
            lambda t: f"{build(t).rstrip()}\n\n{JSON_ONLY}",
            feature=feature,
            max_tokens=max_tokens,
            transcript=transcript,
            system_prompt=system_prompt,
            conversation_id=conversation_id,
        )
    except LLMError as e:
        log.warning("%s: the model call failed: %s", purpose, e.message)
        return None
    try:
        return validate(parse_json_answer(answer.text))
    except (ValueError, TypeError, KeyError) as e:
        cut = " (the answer stopped at its output cap)" if answer.truncated else ""
        log.warning("%s: answer ignored%s: %s", purpose, cut, e)
        return None


_ROLES = {"user": "User", "assistant": "Assistant", "summary": "Summary"}


def transcript_entries(messages: Iterable[Message], max_chars: int = 2000) -> list[str]:
    """Audit records as ``User: …`` / ``Assistant: …`` / ``Tool call name(args)`` / ``Tool
    result name: …`` entries, each cut to ``max_chars`` (errors and empty replies left out)."""
    from agentik.core.types import content_from_json, content_text

    items = []
    for m in messages:
        p = m.payload
        if m.kind == "user":
            items.append(HistoryItem("user", content_text(content_from_json(p["content"]))))
        elif m.kind in ("assistant", "summary"):
            items.append(HistoryItem(m.kind, p.get("text") or ""))
        elif m.kind in ("tool_call", "tool_result"):
            items.append(
                HistoryItem(
                    m.kind,
                    p.get("text") or "",
                    tool_name=p.get("toolName"),
                    args_json=p.get("argsJson"),
                )
            )
    return item_entries(items, max_chars)


def item_entries(items: Iterable[HistoryItem], max_chars: int = 2000) -> list[str]:
    """Working-memory entries as the same lines as :func:`transcript_entries`."""
    lines = []
    for i in items:
        if i.role == "tool_call":
            lines.append(f"Tool call {i.tool_name}({_cut(i.args_json or '', 500)})")
        elif i.role == "tool_result":
            lines.append(f"Tool result {i.tool_name}: {_cut(i.text, 500)}")
        elif i.role in _ROLES and i.text:
            lines.append(f"{_ROLES[i.role]}: {_cut(i.text, max_chars)}")
    return lines


def render_transcript(messages: Iterable[Message], max_chars: int = 2000) -> str:
    """:func:`transcript_entries` as one text."""
    return "\n".join(transcript_entries(messages, max_chars))


def render_items(items: Iterable[HistoryItem], max_chars: int = 2000) -> str:
    """:func:`item_entries` as one text."""
    return "\n".join(item_entries(items, max_chars))


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " […]"
