"""Bundle signatures: ``signature.json`` beside the manifest, and which public keys a load
trusts (docs/security.md says what a signature promises and what it does not).

    <bundle>/signature.json   JSON, keys sorted
      schema_version          "1.0"
      algorithm               "ed25519"
      key_id                  the signer's key id (:func:`key_id`)
      manifest_sha256         integrity.manifest_sha256 of the manifest it signs
      signature               base64 of the 64-byte ed25519 signature of :func:`signed_message`

The manifest's digest fixes every byte of the manifest, and the manifest the sha256 of
every file it lists, so signing the digest signs the library and the sources as well.
``tilekiln sign`` (builder/package/sign.py) writes the file; :func:`require_signature`
checks it.

Trust. A load requires a signature by a trusted key when the call passes ``trusted_keys``,
or when the environment variable ``TILEKILN_TRUSTED_KEYS`` names a file of public keys
(read on every load); both together trust the keys of both. A public key is PEM
(``-----BEGIN PUBLIC KEY-----``, as ``tilekiln keygen`` and ``openssl pkey -pubout`` write
it); a file may hold several.

Checking a signature needs the ``cryptography`` package (``pip install
'tilekiln-runtime[signatures]'``), imported only when a signature is required: a runtime
without it loads unsigned bundles as before, and refuses a load that requires a signature
with :class:`BundleCompatibilityError` naming the package.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from tilekiln._json import load_object
from tilekiln.bundle_files import SIGNATURE_NAME
from tilekiln.errors import BundleCompatibilityError, BundleError, BundleIntegrityError

TRUST_VARIABLE = "TILEKILN_TRUSTED_KEYS"
SCHEMA_VERSION = "1.0"
ALGORITHM = "ed25519"
# What is signed starts with this, so that a signature made with a bundle key means nothing
# to any other protocol the key might be misused for, and nothing else's signature here.
MESSAGE_PREFIX = b"tilekiln bundle manifest sha256 v1\n"
INSTALL_HINT = "pip install 'tilekiln-runtime[signatures]'"
_PEM_KEY = re.compile(rb"-----BEGIN PUBLIC KEY-----.*?-----END PUBLIC KEY-----", re.S)
_HEX64 = re.compile(r"[0-9a-f]{64}")


def signed_message(manifest_sha256: str) -> bytes:
    return MESSAGE_PREFIX + manifest_sha256.encode("ascii")


def key_id(public_key_raw: bytes) -> str:
    """A key's id: the first 16 hex digits of the sha256 of its 32 raw bytes. It names the key
    in messages and picks it among the trusted ones; the signature check uses the key itself."""
    return hashlib.sha256(public_key_raw).hexdigest()[:16]


def signature_record(manifest_sha256: str, public_key_raw: bytes, signature: bytes) -> dict:
    """The content of ``signature.json``."""
    return {"schema_version": SCHEMA_VERSION, "algorithm": ALGORITHM, "key_id": key_id(public_key_raw),
            "manifest_sha256": manifest_sha256, "signature": base64.b64encode(signature).decode("ascii")}


@dataclass(frozen=True)
class Trust:
    """The public keys (PEM blocks) a load trusts, and where they came from, for messages."""

    keys: tuple[bytes, ...]
    origin: str


def trust_for(trusted_keys=None) -> Trust | None:
    """What a load must check: None when no signature is required (no ``trusted_keys`` and no
    ``TILEKILN_TRUSTED_KEYS``). ``trusted_keys`` holds PEM public keys (str or bytes) or paths
    (str or os.PathLike) of files of them. Raises :class:`BundleError` when a key file cannot
    be read or the keys come to none: a load that requires a signature trusts at least one key."""
    keys: list[bytes] = []
    origins = []
    named = os.environ.get(TRUST_VARIABLE, "")
    if named:
        origins.append(f"{TRUST_VARIABLE}={named}")
        keys += _pem_keys(_read_key_file(Path(named), origins[-1]))
    if trusted_keys is not None:
        if isinstance(trusted_keys, (str, bytes, os.PathLike)):
            raise TypeError("trusted_keys: pass a list of public keys or key files, not a single one")
        origins.append("trusted_keys")
        for item in trusted_keys:
            keys += _pem_keys(_key_item(item))
    if not origins:
        return None
    origin = " and ".join(origins)
    if not keys:
        raise BundleError(f"{origin} holds no PEM public key (-----BEGIN PUBLIC KEY-----), so no bundle "
                          "could be trusted; add the public key of the key the bundles are signed with")
    return Trust(tuple(keys), origin)


def require_signature(bundle: str, manifest_sha256: str, raw: bytes | None, trust: Trust) -> str:
    """Check ``raw``, the bundle's ``signature.json`` (None: it has none), against ``trust``;
    returns the signer's key id. Raises :class:`BundleIntegrityError` naming the file when it
    is missing, malformed, signs another manifest, is by an untrusted key or does not verify,
    and :class:`BundleCompatibilityError` when ``cryptography`` is not installed."""
    ed25519, serialization, invalid = _cryptography(bundle, trust)
    trusted = _trusted_keys(trust, ed25519, serialization)
    sign_fix = f"sign the bundle with a key that {trust.origin} trusts: tilekiln sign BUNDLE --key KEY"
    if raw is None:
        raise BundleIntegrityError(bundle, SIGNATURE_NAME, f"missing, and {trust.origin} requires a signature",
                                   sign_fix)
    try:
        record = parse_signature(raw)
    except ValueError as exc:
        raise BundleIntegrityError(bundle, SIGNATURE_NAME, f"malformed ({exc})", sign_fix) from None
    if record["manifest_sha256"] != manifest_sha256:
        raise BundleIntegrityError(
            bundle, SIGNATURE_NAME, f"signs another manifest (sha256 {record['manifest_sha256'][:12]}; this "
            f"bundle's is {manifest_sha256[:12]}): the bundle was rebuilt or changed after it was signed",
            "sign the bundle again (tilekiln sign BUNDLE --key KEY), or reinstall the signed bundle")
    key = trusted.get(record["key_id"])
    if key is None:
        raise BundleIntegrityError(bundle, SIGNATURE_NAME, f"signed by key {record['key_id']}, which "
                                   f"{trust.origin} does not trust", sign_fix)
    try:
        key.verify(record["signature"], signed_message(manifest_sha256))
    except invalid:
        raise BundleIntegrityError(bundle, SIGNATURE_NAME, f"its signature does not verify with trusted key "
                                   f"{record['key_id']}: it was altered, or made with another key", sign_fix) from None
    return record["key_id"]


def parse_signature(raw: bytes) -> dict:
    """``signature.json``'s fields, checked for form (``signature`` decoded to bytes); ``ValueError`` otherwise."""
    data = load_object(raw)
    if str(data.get("schema_version", "")).split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        raise ValueError(f"schema_version {data.get('schema_version')!r}, and this runtime reads "
                         f"{SCHEMA_VERSION.split('.')[0]}.x")
    if data.get("algorithm") != ALGORITHM:
        raise ValueError(f"algorithm {data.get('algorithm')!r}, and this runtime checks {ALGORITHM}")
    digest, kid = data.get("manifest_sha256"), data.get("key_id")
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
        raise ValueError("manifest_sha256 is not a sha256 in hex")
    if not isinstance(kid, str) or not re.fullmatch(r"[0-9a-f]{16}", kid):
        raise ValueError("key_id is not 16 hex digits")
    try:
        signature = base64.b64decode(data.get("signature", ""), validate=True)
    except (binascii.Error, TypeError):
        raise ValueError("signature is not base64") from None
    if len(signature) != 64:
        raise ValueError(f"signature is {len(signature)} bytes, and an ed25519 signature is 64")
    return {"manifest_sha256": digest, "key_id": kid, "signature": signature}


def _cryptography(bundle: str, trust: Trust):
    """The ``cryptography`` modules a check needs, or the error that says how to install them."""
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise BundleCompatibilityError(
            f"bundle {bundle}: {SIGNATURE_NAME}: {trust.origin} requires a signature, and checking it needs the "
            f"Python package 'cryptography', which is not installed; {INSTALL_HINT}") from None
    return ed25519, serialization, InvalidSignature


def _trusted_keys(trust: Trust, ed25519, serialization) -> dict:
    """key id -> public key object, for every key of ``trust``."""
    keys = {}
    for block in trust.keys:
        try:
            key = serialization.load_pem_public_key(block)
        except ValueError as exc:
            raise BundleError(f"{trust.origin}: a public key cannot be read ({exc})") from None
        if not isinstance(key, ed25519.Ed25519PublicKey):
            raise BundleError(f"{trust.origin}: a public key is {type(key).__name__}, not ed25519; bundles are "
                              "signed with ed25519 keys (tilekiln keygen)")
        raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        keys[key_id(raw)] = key
    return keys


def _read_key_file(path: Path, origin: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise BundleError(f"{origin}: the key file cannot be read ({exc.strerror}); a load that requires "
                          "signatures refuses every bundle until it can") from None


def _key_item(item) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str) and "-----BEGIN" in item:
        return item.encode()
    if isinstance(item, (str, os.PathLike)):
        return _read_key_file(Path(item), f"trusted_keys: {item}")
    raise TypeError(f"trusted_keys: {type(item).__name__} is not a PEM public key (str or bytes) or a key file path")


def _pem_keys(text: bytes) -> list[bytes]:
    return _PEM_KEY.findall(text)
