"""``AGENTIK_DATABASE_URL``: which database server holds the store (unset: SQLite)."""

from __future__ import annotations

from urllib.parse import urlsplit

from agentik.core.settings import SecretSafeError

SCHEMES = ("postgresql", "postgres")


def parse_database_url(raw: str) -> str:
    url = raw.strip()
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as e:
        raise SecretSafeError("is not a URL (a port that is not a number?)") from e
    if parts.scheme not in SCHEMES:
        # the message never quotes the URL: it may hold a password
        raise SecretSafeError(
            "must be a postgresql:// URL, e.g. postgresql://agentik:password@db.example.com/agentik"
        )
    return url


def shown_url(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
