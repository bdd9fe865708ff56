"""The JSON error every route answers with: ``{"error": {"code": …, "message": …}}``."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    keep = {k: v for k, v in (headers or {}).items() if k.lower() in ("allow", "retry-after")}
    return web.json_response(
        {"error": {"code": code, "message": message}}, status=status, headers=keep
    )
