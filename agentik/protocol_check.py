"""Proof, for mypy (``make typecheck``), that the in-process agent and the remote client
satisfy the same protocol (:mod:`agentik.core.protocol`); nothing here runs."""

from __future__ import annotations

from agentik.client import RemoteAgent, RemoteConversation, RemoteEventStream
from agentik.core.agent import ChatAgent, ChatConversation
from agentik.core.protocol import Agent, Conversation, EventStream


def agents(local: ChatAgent, remote: RemoteAgent) -> list[Agent]:
    return [local, remote]


def conversations(local: ChatConversation, remote: RemoteConversation) -> list[Conversation]:
    return [local, remote]


def streams(local: ChatConversation, remote: RemoteEventStream) -> list[EventStream]:
    return [local.events(), remote]
