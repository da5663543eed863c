"""Sign a bundle directory, and make a signing key (docs/security.md).

:func:`sign_bundle` verifies the bundle as ``tilekiln.load`` does, then writes
``signature.json`` beside its manifest: an ed25519 signature of the manifest's
digest, which fixes every file the manifest lists (the format and the check are
tilekiln/signing.py's). Signing changes no other file; ``tilekiln package`` then
carries the signature in the wheel. A rebuild replaces the directory and the
signature with it: sign after every build.

:func:`generate_key` writes a new private key (PEM, PKCS#8, unencrypted, mode 0600)
and its public key (PEM), as ``openssl genpkey -algorithm ed25519`` and ``openssl pkey
-pubout`` would. The private key signs; only the public key goes to the machines that load.

Why ``cryptography``: it is the maintained binding of OpenSSL's ed25519 that the runtime's
check uses too (``tilekiln-runtime[signatures]``); ed25519 has one encoding of keys and
signatures and no parameters to choose, so nothing here is hand-written cryptography.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from builder.diagnostics import Diagnostic, DiagnosticError, Location
from tilekiln._files import write_atomic
from tilekiln.errors import BundleError
from tilekiln.bundle_files import MANIFEST_NAME, SIGNATURE_NAME
from tilekiln.manifest import read_bundle
from tilekiln.signing import INSTALL_HINT, key_id, signature_record, signed_message


def sign_bundle(bundle_dir: Path, key_file: Path) -> tuple[Path, str]:
    """Sign the bundle in ``bundle_dir`` with the private key in ``key_file``; returns the
    signature file and the key id. Raises ``DiagnosticError`` (SIGN-INPUT) when the bundle
    does not verify or the key is not an unencrypted ed25519 private key, and (SIGN-DEPENDENCY)
    when ``cryptography`` is missing."""
    ed25519, serialization = _cryptography(key_file)
    if not (bundle_dir / MANIFEST_NAME).is_file():
        raise _error("SIGN-INPUT", bundle_dir, "not a bundle directory (it has no manifest.json)",
                     "pass a directory written by `tilekiln build`, such as artifacts/sm90a")
    try:
        manifest = read_bundle(bundle_dir).manifest
    except BundleError as exc:
        raise _error("SIGN-INPUT", bundle_dir, str(exc), "rebuild the bundle; never sign one that does not verify") \
            from None
    try:
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise _error("SIGN-INPUT", key_file, f"not a readable unencrypted PEM private key ({exc})",
                     "pass the key `tilekiln keygen` wrote") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise _error("SIGN-INPUT", key_file, f"a {type(key).__name__}, not an ed25519 private key",
                     "make one with `tilekiln keygen --out KEY` or `openssl genpkey -algorithm ed25519`")
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    record = signature_record(manifest.sha256, public, key.sign(signed_message(manifest.sha256)))
    path = bundle_dir / SIGNATURE_NAME
    write_atomic(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path, key_id(public)


def generate_key(out: Path) -> tuple[Path, Path, str]:
    """Write a new ed25519 private key to ``out`` (never over an existing file) and its public key
    to ``out`` + ``.pub``; returns both paths and the key id."""
    ed25519, serialization = _cryptography(out)
    public_path = out.with_name(out.name + ".pub")
    for path in (out, public_path):
        if os.path.lexists(path):
            raise _error("KEYGEN-OUTPUT", path, "exists already", "choose another --out; a key is never overwritten")
    key = ed25519.Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    public = key.public_key()
    out.parent.mkdir(parents=True, exist_ok=True)
    # Created 0600 in one step, so the key is never readable by others, not even briefly.
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with open(fd, "wb") as f:
        f.write(private_pem)
    public_path.write_bytes(public.public_bytes(serialization.Encoding.PEM,
                                                serialization.PublicFormat.SubjectPublicKeyInfo))
    return out, public_path, key_id(public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def _cryptography(key_file: Path):
    """The modules that sign and make keys; the error names what to install (at the key it was to use)."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise _error("SIGN-DEPENDENCY", key_file, "ed25519 keys need the Python package 'cryptography', which is "
                     "not installed", INSTALL_HINT) from None
    return ed25519, serialization


def _error(rule: str, path: Path, problem: str, hint: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic(rule, problem, Location(str(path)), hint)])
