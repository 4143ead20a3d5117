"""``Authenticator``: the public API's bearer-token check, shared by the gRPC interceptor and the HTTP front.

A call carries ``authorization: Bearer <token>`` (gRPC metadata or HTTP header). The token must be
a line of ``--auth-token-file`` (``TokenTable``). A token that binds a tenant makes it the request's
tenant (the prefix cache's salt); a request that asserts another tenant is refused. Refusals are
``AuthRefused`` with a reason (the ``reason`` label of ``baton_auth_refused_total``) and a message
that says what is missing or wrong, never the token itself.
"""

from collections.abc import Callable

from .auth_tokens import Caller, TokenTable

MISSING = "missing"  # no authorization header or metadata
MALFORMED = "malformed"  # not "Bearer <token>"
INVALID = "invalid"  # a token no line of the file holds
TENANT = "tenant"  # a tenant-bound token with a request asserting another tenant
REASONS = (MISSING, MALFORMED, INVALID, TENANT)


class AuthRefused(Exception):
    """A refused call. ``reason``: one of MISSING, MALFORMED, INVALID (unauthenticated: gRPC
    UNAUTHENTICATED, HTTP 401) or TENANT (authenticated but not allowed: PERMISSION_DENIED, 403)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message

    @property
    def unauthenticated(self) -> bool:
        return self.reason != TENANT


class Authenticator:
    """Checks calls against ``tokens``; ``on_refused(reason)`` is called for every refusal."""

    def __init__(self, tokens: TokenTable, on_refused: Callable[[str], None] = lambda reason: None):
        self.tokens = tokens
        self._on_refused = on_refused

    def authenticate(self, authorization: str | None) -> Caller:
        """The caller that ``authorization`` (the header's value; None when absent) proves.

        Raises:
            AuthRefused: MISSING, MALFORMED or INVALID.
        """
        if not authorization:
            raise self._refuse(MISSING, "authorization: missing; send 'authorization: Bearer <token>'")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise self._refuse(MALFORMED, "authorization: expected 'Bearer <token>'")
        caller = self.tokens.lookup(token)
        if caller is None:
            raise self._refuse(INVALID, "authorization: the bearer token is not valid")
        return caller

    def tenant(self, caller: Caller, asserted: str, field: str) -> str:
        """The request's tenant: the token's when it binds one, else what the request asserted.

        Args:
            asserted: the tenant the request names ("" when none).
            field: where it named it (``tenant``, ``X-Tenant``), for the error message.

        Raises:
            AuthRefused: TENANT, when the token binds a tenant and the request asserts another.
        """
        if not caller.tenant:
            return asserted
        if asserted and asserted != caller.tenant:
            raise self._refuse(
                TENANT,
                f"{field}: {asserted!r} is not the tenant this token is bound to; "
                f"leave {field} out (the token's tenant applies) or use that tenant's token",
            )
        return caller.tenant

    def _refuse(self, reason: str, message: str) -> AuthRefused:
        self._on_refused(reason)
        return AuthRefused(reason, message)
