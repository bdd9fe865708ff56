"""agentik-webhook: ``POST /webhook/NAME`` with ``{"text": "..."}`` turns into an event message
in the conversation called NAME (made on first use), e.g. for a CI or an alarm to tell the agent.

The route checks its own secret (``X-Webhook-Secret``, ``WEBHOOK_SECRET``), so it is marked
``public`` (no agentik API key needed); it is off while ``WEBHOOK_SECRET`` is unset.
"""

import hmac

from aiohttp import web

from agentik.api import MessageContext, Setting, TextPart, hookimpl, public


def parse_secret(raw):
    if len(raw) < 16:
        raise ValueError("must be at least 16 characters")
    return raw


@hookimpl
def register_settings(register):
    register(
        Setting(
            "WEBHOOK_SECRET",
            None,
            parse_secret,
            "Secret a caller sends as X-Webhook-Secret; unset: no webhook route.",
            secret=True,
        )
    )


def error(status, code, message):
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


def make_handler(agent, secret):
    @public  # its own secret, not the agentik API key
    async def webhook(request):
        given = request.headers.get("X-Webhook-Secret", "")
        if not hmac.compare_digest(given.encode(), secret.encode()):
            return error(401, "unauthorized", "a valid X-Webhook-Secret header is required")
        try:
            body = await request.json()
            text = body["text"]
            assert isinstance(text, str) and text.strip()
        except (ValueError, KeyError, TypeError, AssertionError):
            return error(400, "bad_request", 'the body must be {"text": "..."}')
        name = request.match_info["name"]
        conversation = await agent.aliased_conversation("webhook", name, title=f"webhook {name}")
        context = MessageContext("event", f"webhook {name}", source_id=body.get("id"))
        message = await conversation.send([TextPart(text)], context)
        return web.json_response(
            {"conversationId": conversation.id, "messageId": message.id}, status=202
        )

    return webhook


@hookimpl
def register_transports(register):
    def setup(app, agent, settings):
        if settings["WEBHOOK_SECRET"] is not None:
            handler = make_handler(agent, settings["WEBHOOK_SECRET"])
            app.router.add_post("/webhook/{name}", handler)

    register("webhook", setup)


@hookimpl
def banner_lines(settings):
    if settings["WEBHOOK_SECRET"] is None:
        return ["webhook: off (WEBHOOK_SECRET)"]
    return ["  POST /webhook/{name}"]  # with the endpoints
