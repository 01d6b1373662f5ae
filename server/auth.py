"""Optional API key: ``X-API-Key: KEY`` or ``Authorization: Bearer KEY`` on /v1/* when one is configured."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.datastructures import Headers

from server.errors import ApiError

api_key_header = APIKeyHeader(
    name="X-API-Key", auto_error=False, description="needed only when the server is started with an API key"
)
bearer = HTTPBearer(auto_error=False, description="the API key as a bearer token (alternative to X-API-Key)")


def key_matches(given: str | None, expected: str | None) -> bool:
    if expected is None:
        return True
    # surrogatepass: JSON may carry a lone surrogate ("\udcff", the WebSocket start's api_key), which plain
    # encode() refused with UnicodeEncodeError, a 1011 internal error and a logged traceback before authenticating
    return given is not None and hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )


def key_from_headers(headers: Headers) -> str | None:
    key = headers.get("x-api-key")
    if key:
        return key
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def unauthorized() -> ApiError:
    return ApiError(
        401,
        "unauthorized",
        "missing or wrong API key (X-API-Key or Authorization: Bearer)",
        {"WWW-Authenticate": "Bearer"},
    )


async def require_api_key(
    request: Request,
    key: Annotated[str | None, Security(api_key_header)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
) -> None:
    expected = request.app.state.config.api_key
    given = key or (credentials.credentials if credentials is not None else None)
    if not key_matches(given, expected):
        raise unauthorized()
