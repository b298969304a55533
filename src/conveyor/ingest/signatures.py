"""Webhook signature checks (pure): HMAC-SHA256 over the raw body, or a shared token, with rotation."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable


def hmac_hex(secret: str, body: bytes) -> str:
    """Hex HMAC-SHA256 of `body` under `secret`."""
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def github_signature(secret: str, body: bytes) -> str:
    """The `X-Hub-Signature-256` value GitHub sends for `body`."""
    return "sha256=" + hmac_hex(secret, body)


def verify_hmac(header_value: str | None, body: bytes, secrets: Iterable[str]) -> bool:
    """True when the header (`sha256=<hex>` or bare hex) matches the body under any of `secrets`.

    Several secrets verify during a rotation (`webhook_secret` and `webhook_secret_next`).
    """
    if not header_value:
        return False
    given = header_value.strip().removeprefix("sha256=").lower()
    ok = False
    for secret in secrets:
        # No early exit: every configured secret costs the same, whichever one matches.
        ok |= hmac.compare_digest(given, hmac_hex(secret, body))
    return ok


def verify_token(header_value: str | None, secrets: Iterable[str]) -> bool:
    """True when the header equals one of the shared tokens (constant-time)."""
    if not header_value:
        return False
    ok = False
    for secret in secrets:
        ok |= hmac.compare_digest(header_value.strip().encode(), secret.encode())
    return ok
