"""Credentials at rest: the URIs of a changefeed are stored in etcd sealed with a key the captures hold.

A sealed value is ``tidewater-enc:v1:`` + a Fernet token (AES-128-CBC + HMAC-SHA256, with its time stamp;
``cryptography``). The key file given to every capture (``cdc server --secret-key-file``) holds one or more
Fernet keys, one per line (``#`` comments): the first seals, every one opens, so keys can be rotated
without downtime (docs/operations.md, "Credentials in etcd"). ``cdc secret-key generate`` prints a new key.

Values that are not sealed (changefeeds stored before encryption was turned on) are read as they are, and
sealed with the first key the next time they are written (:meth:`MetaStore.reseal_changefeeds` does it for
all of them when a capture starts). Pure and thread-safe.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from cdc.errors import InvalidConfig

PREFIX = "tidewater-enc:v1:"
KEY_FILE_ENV = "TIDEWATER_SECRET_KEY_FILE"


class UnopenableSecret(ValueError):
    """A sealed value that none of this capture's keys opens."""


def is_sealed(value: str) -> bool:
    return value.startswith(PREFIX)


def generate_key() -> str:
    return Fernet.generate_key().decode()


class SecretBox:
    """Seals and opens strings with a key ring (the first key seals; all of them open)."""

    def __init__(self, keys: Sequence[str | bytes]) -> None:
        if not keys:
            raise InvalidConfig("a secret key ring needs at least one key")
        try:
            self._keys = [Fernet(k) for k in keys]
        except (ValueError, TypeError) as exc:
            raise InvalidConfig("a secret key is not a Fernet key (32 url-safe base64-encoded bytes; "
                                "`cdc secret-key generate` makes one)") from exc
        self._ring = MultiFernet(self._keys)

    @classmethod
    def from_file(cls, path: str) -> SecretBox:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise InvalidConfig(f"cannot read the secret key file {path}: {exc.strerror or exc}") from exc
        keys = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
        if not keys:
            raise InvalidConfig(f"the secret key file {path} holds no key")
        try:
            return cls(keys)
        except InvalidConfig as exc:
            raise InvalidConfig(f"{path}: {exc.message}") from exc

    @classmethod
    def from_config(cls, key_file: str, environ: dict[str, str] | None = None) -> SecretBox | None:
        """The key ring of ``key_file``, else of ``$TIDEWATER_SECRET_KEY_FILE``; None when neither is set."""
        path = key_file or (os.environ if environ is None else environ).get(KEY_FILE_ENV, "")
        return cls.from_file(path) if path else None

    def seal(self, plain: str) -> str:
        if is_sealed(plain):  # sealed by a key we could not open: keep it as it is
            return plain
        return PREFIX + self._keys[0].encrypt(plain.encode()).decode()

    def open(self, value: str) -> str:
        """The plain text of a sealed ``value``; an unsealed value as it is. :class:`UnopenableSecret` when
        no key of the ring opens it."""
        if not is_sealed(value):
            return value
        try:
            return self._ring.decrypt(value[len(PREFIX):].encode()).decode()
        except (InvalidToken, UnicodeDecodeError) as exc:
            raise UnopenableSecret("sealed with a key that is not in this capture's secret key file") from exc

    def needs_reseal(self, value: str) -> bool:
        """Plain, or sealed with a key other than the first (but one this ring opens)."""
        if not is_sealed(value):
            return True
        token = value[len(PREFIX):].encode()
        try:
            self._keys[0].decrypt(token)
            return False
        except InvalidToken:
            try:
                self._ring.decrypt(token)
            except InvalidToken:
                return False  # cannot open it: leave it to a capture that can
            return True
