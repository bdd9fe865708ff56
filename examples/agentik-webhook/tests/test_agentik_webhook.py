"""The webhook route through aiohttp's test client (pytest-aiohttp), on an app made by
agentik.api.make_app with the plugin."""

import agentik_webhook
from agentik.api import make_app

PLUGIN = [("agentik_webhook", agentik_webhook)]
SECRET = "s3cret-s3cret-s3cret"


async def test_an_event_message_in_the_named_conversation(aiohttp_client):
    app = make_app(plugins=PLUGIN, env={"WEBHOOK_SECRET": SECRET, "AGENTIK_API_KEY": "k" * 16})
    client = await aiohttp_client(app)
    headers = {"X-Webhook-Secret": SECRET}
    r = await client.post(
        "/webhook/ci", json={"text": "build 42 failed", "id": "b42"}, headers=headers
    )
    assert r.status == 202, await r.text()
    first = (await r.json())["conversationId"]
    r = await client.post("/webhook/ci", json={"text": "build 43 passed"}, headers=headers)
    assert (await r.json())["conversationId"] == first  # the same conversation by its name
    # the agent's own API needs the key; the webhook needed only its secret
    auth = {"Authorization": "Bearer " + "k" * 16}
    r = await client.get(f"/agentik/conversations/{first}/messages", headers=auth)
    users = [m for m in (await r.json())["items"] if m["type"] == "user"]
    assert users[0]["context"] == {
        "origin": "event",
        "description": "webhook ci",
        "sourceId": "b42",
    }


async def test_a_wrong_secret_or_body_is_a_json_error(aiohttp_client):
    client = await aiohttp_client(make_app(plugins=PLUGIN, env={"WEBHOOK_SECRET": SECRET}))
    r = await client.post("/webhook/ci", json={"text": "x"}, headers={"X-Webhook-Secret": "no"})
    assert r.status == 401 and (await r.json())["error"]["code"] == "unauthorized"
    r = await client.post("/webhook/ci", json={}, headers={"X-Webhook-Secret": SECRET})
    assert r.status == 400 and (await r.json())["error"]["code"] == "bad_request"


async def test_off_without_a_secret(aiohttp_client):
    client = await aiohttp_client(make_app(plugins=PLUGIN))
    assert (await client.post("/webhook/ci", json={"text": "x"})).status == 404
