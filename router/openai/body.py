"""A request's JSON body, read with limits: its media type, its size, its nesting depth.

Every refusal is a ``RequestError`` naming ``Content-Type`` (415) or ``body`` (413 for the size,
400 otherwise), raised before any field is looked at.
"""

import json

from aiohttp import web

from .fields import RequestError

MAX_BODY_BYTES = 32 * 2**20
# OpenAI bodies nest four levels deep (messages -> message -> content parts -> part); the limit
# leaves room for unknown fields while keeping every walk over the body shallow.
MAX_JSON_DEPTH = 32


async def read_json_body(request: web.Request) -> dict:
    """The body as a JSON object. Raises RequestError: 415 for a media type other than JSON, 413
    above ``MAX_BODY_BYTES``, 400 for invalid JSON, a non-object, or nesting past ``MAX_JSON_DEPTH``."""
    _check_media_type(request)
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise RequestError(
            "body", f"body: larger than the {MAX_BODY_BYTES // 2**20} MiB limit", status=413
        ) from None
    try:
        body = json.loads(raw)
    except RecursionError:  # the C parser nests one call per level; it gives up, cleanly, past ~1000
        raise RequestError("body", f"body: JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (UnicodeDecodeError, ValueError) as error:
        raise RequestError("body", f"body: not valid JSON ({error})") from None
    if not isinstance(body, dict):
        raise RequestError("body", "body: must be a JSON object")
    if _deeper_than(body, MAX_JSON_DEPTH):
        raise RequestError("body", f"body: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return body


def _check_media_type(request: web.Request) -> None:
    """JSON, or no ``Content-Type`` at all. Refusing the rest matters beyond tidiness: ``text/plain``
    and form bodies are what a browser page may send cross-site without a preflight."""
    if "Content-Type" not in request.headers:
        return
    kind = request.content_type
    if kind != "application/json" and not (kind.startswith("application/") and kind.endswith("+json")):
        raise RequestError(
            "Content-Type", f"Content-Type: must be application/json, got {kind[:64]!r}", status=415
        )


def _deeper_than(value, limit: int) -> bool:
    """Whether a parsed JSON value nests more than ``limit`` containers deep (without recursion)."""
    pending = [(value, 1)]
    while pending:
        container, depth = pending.pop()
        if depth > limit:
            return True
        items = container.values() if isinstance(container, dict) else container
        pending.extend((item, depth + 1) for item in items if isinstance(item, (dict, list)))
    return False
