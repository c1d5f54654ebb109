"""Bearer-key checks for the client API and the admin endpoints.

Keys come from config (`router.api_key`, `router.admin_key`) or the env vars
`PDORCH_ROUTER_API_KEY` / `PDORCH_ROUTER_ADMIN_KEY` (the config loader maps those). They are
compared in constant time and never logged or echoed in an error message.

Rules:
- no api_key configured   -> client endpoints are open.
- admin_key configured    -> admin endpoints need exactly that key (401 without a key or with an
                             unknown one, 403 with a valid client key).
- no admin_key configured -> admin endpoints fall back to the client rule.
- previous_api_key        -> accepted like api_key, during a rotation (clients move at their pace).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from router.errors import forbidden, unauthorized


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


@dataclass(frozen=True)
class Auth:
    api_key: str = ""
    admin_key: str = ""
    previous_api_key: str = ""

    def __repr__(self) -> str:  # NOTE: keep keys out of logs and tracebacks
        return (f"Auth(api_key={'set' if self.api_key else 'unset'}, admin_key={'set' if self.admin_key else 'unset'}, "
                f"previous_api_key={'set' if self.previous_api_key else 'unset'})")

    def _client_key(self, token: str) -> bool:
        return _same(token, self.api_key) or bool(self.previous_api_key and _same(token, self.previous_api_key))

    def check_request(self, request) -> None:
        """check_client of a request's Authorization header (`request.headers`), read only when a key is set:
        with auth off the hot path (router/http/hot_path.py HotRequest) never builds its headers' mapping."""
        if self.api_key:
            self.check_client(request.headers.get("authorization"))

    def check_client(self, authorization: str | None) -> None:
        if not self.api_key:
            return
        token = _bearer(authorization)
        if token is None:
            raise unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        if self._client_key(token) or (self.admin_key and _same(token, self.admin_key)):
            return
        raise unauthorized("invalid API key")

    def check_admin(self, authorization: str | None) -> None:
        if not self.admin_key:
            self.check_client(authorization)
            return
        token = _bearer(authorization)
        if token is None:
            raise unauthorized("missing admin key: send 'Authorization: Bearer <admin key>'")
        if _same(token, self.admin_key):
            return
        if self.api_key and self._client_key(token):
            raise forbidden("this endpoint needs the admin key")
        raise unauthorized("invalid admin key")
