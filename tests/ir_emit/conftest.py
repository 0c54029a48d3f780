"""Fixtures of the IR-level tests: the session's element-kernel JIT (see tests/harness.py)."""
from __future__ import annotations

import pytest

from tests.harness import JitHarness


@pytest.fixture(scope="session")
def jit() -> JitHarness:
    """The session's JIT harness (one engine, modules cached by key)."""
    return JitHarness()
