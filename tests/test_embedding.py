"""The in-process API reads like the README's example (issue #12, defect 11)."""

from __future__ import annotations


async def test_events_yields_event_objects_and_event_items_their_ids(make_agent):
    from agentik.core.events import StreamItem
    from agentik.core.types import End, TextPart

    agent = await make_agent()
    conv = await agent.create_conversation()
    events = conv.events()  # subscribed at the call, before the send
    items = conv.event_items()
    await conv.send([TextPart("hi")])
    got = []
    async for event in events:
        got.append(event)
        if isinstance(event, End):
            break
    assert [e.type for e in got] == ["StartResponse", "AppendText", "End"]
    first = await items.__anext__()
    assert isinstance(first, StreamItem) and first.event == got[0]
    resumed = conv.event_items(after=first.seq)
    assert (await resumed.__anext__()).event == got[1]
    await items.aclose()
    await resumed.aclose()
