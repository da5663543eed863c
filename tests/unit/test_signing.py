"""Signed bundles: `tilekiln keygen` and `tilekiln sign` (builder/package/sign.py), and the loads
that require a signature by a trusted key (tilekiln/signing.py): through ``trusted_keys``, through
``TILEKILN_TRUSTED_KEYS`` (the default bundle of a simulated device included), and without the
``cryptography`` package. Synthetic bundles whose library is never opened."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import tilekiln
from builder.cli.commands import main
from builder.package.sign import generate_key, sign_bundle
from tests.records import kernel_record, write_bundle
from tilekiln.errors import BundleCompatibilityError, BundleError, BundleIntegrityError
from tilekiln.signing import INSTALL_HINT, TRUST_VARIABLE

SIGNATURE = "signature.json"


@pytest.fixture
def bundle(tmp_path) -> Path:
    return write_bundle(tmp_path / "bundles" / "sm90a", (kernel_record(0, "k_square", (128, 128, 64)),),
                        library=b"\x7fELF library")


@pytest.fixture
def key(tmp_path) -> tuple[Path, Path]:
    private, public, _ = generate_key(tmp_path / "keys" / "release")
    return private, public


@pytest.fixture
def other_key(tmp_path) -> tuple[Path, Path]:
    private, public, _ = generate_key(tmp_path / "keys" / "other")
    return private, public


@pytest.fixture(autouse=True)
def no_trust_from_the_environment(monkeypatch):
    monkeypatch.delenv(TRUST_VARIABLE, raising=False)


@pytest.fixture
def without_cryptography(monkeypatch):
    """An interpreter where ``import cryptography`` fails, as without the signatures extra."""
    for name in [n for n in sys.modules if n == "cryptography" or n.startswith("cryptography.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "cryptography", None)


def refused(directory: Path, **kwargs) -> BundleIntegrityError:
    with pytest.raises(BundleIntegrityError) as info:
        tilekiln.load(directory, **kwargs)
    return info.value


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(key):
    private, public = key
    assert private.stat().st_mode & 0o777 == 0o600
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    result = CliRunner().invoke(main, ["keygen", "--out", str(private)])
    assert result.exit_code == 1 and "KEYGEN-OUTPUT" in result.output


def test_a_signed_bundle_loads_with_its_public_key_in_every_form(bundle, key):
    private, public = key
    _, kid = sign_bundle(bundle, private)
    assert json.loads((bundle / SIGNATURE).read_text())["key_id"] == kid
    assert tilekiln.load(bundle, trusted_keys=[public]).name == "sm90a"  # a key file
    assert tilekiln.load(bundle, trusted_keys=[str(public)]).name == "sm90a"
    assert tilekiln.load(bundle, trusted_keys=[public.read_text()]).name == "sm90a"  # PEM text
    assert tilekiln.load(bundle, trusted_keys=[public.read_bytes()]).name == "sm90a"


def test_sign_on_the_command_line(bundle, key):
    result = CliRunner().invoke(main, ["sign", str(bundle), "--key", str(key[0])])
    assert result.exit_code == 0, result.output
    assert tilekiln.load(bundle, trusted_keys=[key[1]]).name == "sm90a"


def test_an_unsigned_bundle_is_refused_when_keys_are_trusted(bundle, key):
    assert refused(bundle, trusted_keys=[key[1]]).file == SIGNATURE


def test_a_bundle_loaded_unsigned_before_is_still_refused_when_keys_are_trusted(bundle, key):
    tilekiln.load(bundle)  # cached, never checked for a signature
    assert refused(bundle, trusted_keys=[key[1]]).file == SIGNATURE


def test_a_bundle_signed_by_another_key_is_refused(bundle, key, other_key):
    sign_bundle(bundle, other_key[0])
    assert refused(bundle, trusted_keys=[key[1]]).file == SIGNATURE
    assert tilekiln.load(bundle, trusted_keys=[key[1], other_key[1]]).name == "sm90a"


def test_a_signature_that_does_not_verify_with_the_key_it_names_is_refused(bundle, key, other_key):
    """Another key's signature relabelled with the trusted key's id."""
    sign_bundle(bundle, other_key[0])
    record = json.loads((bundle / SIGNATURE).read_text())
    sign_bundle(bundle, key[0])
    record["key_id"] = json.loads((bundle / SIGNATURE).read_text())["key_id"]
    (bundle / SIGNATURE).write_text(json.dumps(record))
    assert refused(bundle, trusted_keys=[key[1]]).file == SIGNATURE


@pytest.mark.parametrize("damage", ["not JSON", "signature cut short", "another algorithm"])
def test_a_malformed_signature_file_is_refused(bundle, key, damage):
    sign_bundle(bundle, key[0])
    record = json.loads((bundle / SIGNATURE).read_text())
    if damage == "not JSON":
        (bundle / SIGNATURE).write_text("{")
    else:
        record.update({"signature cut short": {"signature": record["signature"][:40]},
                       "another algorithm": {"algorithm": "rsa"}}[damage])
        (bundle / SIGNATURE).write_text(json.dumps(record))
    assert refused(bundle, trusted_keys=[key[1]]).file == SIGNATURE


def test_a_bundle_changed_after_it_was_signed_is_refused(bundle, key, tmp_path):
    sign_bundle(bundle, key[0])
    signature = (bundle / SIGNATURE).read_bytes()
    rebuilt = write_bundle(tmp_path / "rebuilt" / "sm90a", (kernel_record(0, "k_wide", (128, 256, 64)),))
    (rebuilt / SIGNATURE).write_bytes(signature)  # a valid signature, of the other manifest
    assert refused(rebuilt, trusted_keys=[key[1]]).file == SIGNATURE


def test_an_empty_or_unreadable_set_of_trusted_keys_trusts_nothing(bundle, key, tmp_path, monkeypatch):
    sign_bundle(bundle, key[0])
    with pytest.raises(BundleError):
        tilekiln.load(bundle, trusted_keys=[])
    monkeypatch.setenv(TRUST_VARIABLE, str(tmp_path / "no-such-file.pem"))
    with pytest.raises(BundleError):
        tilekiln.load(bundle)


def test_the_environment_makes_signatures_mandatory_for_the_default_bundle(bundle, key, monkeypatch):
    """The device-default bundle (tilekiln._default_bundle), on a simulated Hopper device."""
    monkeypatch.setenv("TILEKILN_BUNDLE_PATH", str(bundle.parent))
    monkeypatch.setattr("tilekiln._driver.compute_capability", lambda device: (9, 0))
    monkeypatch.setattr(tilekiln, "_default_for_device", {})
    monkeypatch.setenv(TRUST_VARIABLE, str(key[1]))
    with pytest.raises(BundleIntegrityError) as info:
        tilekiln._default_bundle(0)
    assert info.value.file == SIGNATURE
    sign_bundle(bundle, key[0])
    assert tilekiln._default_bundle(0).name == "sm90a"
    monkeypatch.setattr(tilekiln, "_default_for_device", {})
    monkeypatch.setenv(TRUST_VARIABLE, str(generate_key(bundle.parent.parent / "stranger")[1]))
    with pytest.raises(BundleIntegrityError):
        tilekiln._default_bundle(0)  # the same bundle, cached by path, is checked against the new keys


def test_without_cryptography_unsigned_loads_work_and_required_signatures_say_what_to_install(
        bundle, key, without_cryptography):
    assert tilekiln.load(bundle).name == "sm90a"
    with pytest.raises(BundleCompatibilityError) as info:
        tilekiln.load(bundle, trusted_keys=[key[1]])
    assert "cryptography" in str(info.value) and INSTALL_HINT in str(info.value)


def test_sign_without_cryptography_says_what_to_install(bundle, key, without_cryptography):
    result = CliRunner().invoke(main, ["sign", str(bundle), "--key", str(key[0])])
    assert result.exit_code == 1 and "SIGN-DEPENDENCY" in result.output
    assert not (bundle / SIGNATURE).exists()


def test_a_damaged_bundle_is_never_signed(bundle, key):
    (bundle / "lib" / "lib.so").write_bytes(b"tampered")
    result = CliRunner().invoke(main, ["sign", str(bundle), "--key", str(key[0])])
    assert result.exit_code == 1 and "SIGN-INPUT" in result.output
    assert not (bundle / SIGNATURE).exists()

