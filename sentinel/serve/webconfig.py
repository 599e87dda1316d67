"""TLS, mutual TLS and basic auth from a Prometheus exporter-toolkit web config file.

The format is the one node_exporter and every exporter built on
``prometheus/exporter-toolkit`` read with ``--web.config.file``, so an operator reuses
the file they already have::

    tls_server_config:
      cert_file: server.crt          # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      min_version: TLS12
    basic_auth_users:
      prometheus: $2y$10$...         # bcrypt hashes (htpasswd -nBC 10 prometheus)
    http_server_config:
      headers: {X-Frame-Options: deny}

``client_auth_type`` takes ``NoClientCert``, ``VerifyClientCertIfGiven`` and
``RequireAndVerifyClientCert``; Python's TLS cannot ask for a certificate without
verifying it, so ``RequestClientCert`` and ``RequireAnyClientCert`` are refused rather
than silently weakened. Errors are ``ConfigError`` lines naming the dotted key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ssl
import threading
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from sentinel.rules.config import ConfigError, format_errors

_AUTH_TYPES = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
             "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# a valid bcrypt hash of a random password: unknown users cost a check too (no user oracle)
_DUMMY_HASH = b"$2b$10$H0yWQLgUEyobtyarSTzqAeJJLcFkRy15GzI3pb/.XdZ76FBbsnunm"


class TlsServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cert_file: str
    key_file: str
    client_auth_type: Literal["NoClientCert", "RequestClientCert", "RequireAnyClientCert",
                              "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"] = "NoClientCert"
    client_ca_file: str | None = None
    min_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS12"
    max_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS13"
    client_allowed_sans: list[str] = []
    prefer_server_cipher_suites: bool = True  # Go's; Python's server always prefers its order

    @field_validator("client_auth_type")
    @classmethod
    def _supported(cls, v: str) -> str:
        if v not in _AUTH_TYPES:
            raise ValueError(f"{v} asks for a client certificate without verifying it, which sentinel does "
                             "not support; use VerifyClientCertIfGiven or RequireAndVerifyClientCert")
        return v


class HttpServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    http2: bool = True  # accepted for compatibility; sentinel serves HTTP/1.1
    headers: dict[str, str] = {}


class WebConfigFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tls_server_config: TlsServerConfig | None = None
    http_server_config: HttpServerConfig = HttpServerConfig()
    basic_auth_users: dict[str, str] = {}

    @field_validator("basic_auth_users")
    @classmethod
    def _bcrypt(cls, users: dict[str, str]) -> dict[str, str]:
        for user, hashed in users.items():
            if not hashed.startswith(("$2a$", "$2b$", "$2y$")) or len(hashed) != 60:
                raise ValueError(f"the password of {user!r} is not a bcrypt hash (htpasswd -nBC 10 {user})")
        return users


class WebSecurity:
    """A loaded web config: the TLS context (if any) and the basic-auth check.

    Args:
        config: the validated file.
        base: the file's folder, which relative paths are resolved against.

    Raises:
        ConfigError: a certificate or key cannot be loaded.
    """

    def __init__(self, config: WebConfigFile, base: Path, source: str = "web config") -> None:
        self.config = config
        self.headers = dict(config.http_server_config.headers)
        self.users = {u: h.encode() for u, h in config.basic_auth_users.items()}
        self._ok: dict[tuple[str, bytes], bool] = {}  # bcrypt costs ~50 ms: cache verdicts
        self._lock = threading.Lock()
        self.context: ssl.SSLContext | None = None
        self.allowed_sans = set(config.tls_server_config.client_allowed_sans) if config.tls_server_config else set()
        tls = config.tls_server_config
        if tls is None:
            return
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version, ctx.maximum_version = _VERSIONS[tls.min_version], _VERSIONS[tls.max_version]
        try:
            ctx.load_cert_chain(_resolve(base, tls.cert_file), _resolve(base, tls.key_file))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError([f"{source}: tls_server_config.cert_file: cannot load the certificate and key: "
                               f"{getattr(exc, 'strerror', None) or exc}"]) from None
        ctx.verify_mode = _AUTH_TYPES[tls.client_auth_type]
        if ctx.verify_mode != ssl.CERT_NONE:
            if not tls.client_ca_file:
                raise ConfigError([f"{source}: tls_server_config.client_ca_file: required by "
                                   f"client_auth_type {tls.client_auth_type}"])
            try:
                ctx.load_verify_locations(_resolve(base, tls.client_ca_file))
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError([f"{source}: tls_server_config.client_ca_file: cannot load: "
                                   f"{getattr(exc, 'strerror', None) or exc}"]) from None
        self.context = ctx

    @property
    def tls(self) -> bool:
        return self.context is not None

    @property
    def auth(self) -> bool:
        return bool(self.users)

    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header passes basic auth (True when none is configured)."""
        if not self.users:
            return True
        if not header or not header[:6].lower() == "basic ":
            return False
        try:
            user, sep, password = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return False
        if not sep:
            return False
        key = (user, hashlib.sha256(password.encode()).digest())
        with self._lock:
            cached = self._ok.get(key)
        if cached is not None:
            return cached
        import bcrypt  # the daemon side only, and only when basic auth is configured

        hashed = self.users.get(user)
        ok = bcrypt.checkpw(password.encode(), hashed if hashed is not None else _DUMMY_HASH) and hashed is not None
        with self._lock:
            if len(self._ok) > 256:
                self._ok.clear()
            self._ok[key] = ok
        return ok

    def peer_allowed(self, cert: dict[str, Any] | None) -> bool:
        """``client_allowed_sans``: the client certificate names one of them (True if unset)."""
        if not self.allowed_sans:
            return True
        sans = {v for _, v in (cert or {}).get("subjectAltName", ())}
        return bool(sans & self.allowed_sans)


def _resolve(base: Path, path: str) -> str:
    p = Path(path)
    return str(p if p.is_absolute() else base / p)


def load_web_config(path: str | Path) -> WebSecurity:
    """Read and check a web config file.

    Raises:
        ConfigError: unreadable, not YAML, an unknown or invalid key, or a certificate,
            key or CA that cannot be loaded; lines name ``<file>: dotted.key``.
    """
    path = Path(path)
    src = str(path)
    try:
        raw = yaml.safe_load(path.read_bytes().decode("utf-8")) or {}
    except OSError as exc:
        raise ConfigError([f"{src}: cannot read: {exc.strerror or type(exc).__name__}"]) from None
    except UnicodeDecodeError:
        raise ConfigError([f"{src}: not UTF-8 text"]) from None
    except yaml.YAMLError:
        raise ConfigError([f"{src}: not valid YAML"]) from None
    if not isinstance(raw, dict):
        raise ConfigError([f"{src}: the web config must be a mapping"])
    try:
        config = WebConfigFile(**raw)
    except ValidationError as exc:
        raise ConfigError([f"{src}: {line}" for line in format_errors(exc)]) from None
    return WebSecurity(config, path.resolve().parent, src)
