"""The runtime range a bundle wheel requires follows the runtime's versioning promise
(docs/bundle-format.md, "Versions"): same minor below 1.0, same major from 1.0."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from packaging.specifiers import SpecifierSet

from builder.package.manifest import runtime_requirement

parts = st.integers(min_value=0, max_value=40)


def test_examples_from_the_spec():
    assert runtime_requirement("0.1.0") == ">=0.1,<0.2"
    assert runtime_requirement("1.4.2") == ">=1.4,<2"


@given(parts, parts, parts)
def test_range_admits_the_series_and_nothing_that_may_break_it(major, minor, patch):
    spec = SpecifierSet(runtime_requirement(f"{major}.{minor}.{patch}"))
    assert f"{major}.{minor}.{patch}" in spec and f"{major}.{minor}.{patch + 7}" in spec
    assert (f"{major}.{minor + 1}.0" in spec) is (major > 0)
    assert f"{major + 1}.0.0" not in spec
    if minor > 0:
        assert f"{major}.{minor - 1}.0" not in spec
