"""The BLAS/LAPACK symbol table and the thread knob."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import llvmlite.binding as llvm
import pytest
from llvmlite import ir

from rlx_llvm.errors import RlxError
from rlx_llvm.kernels import blas, threads


def test_required_routines_are_registered_under_our_prefix() -> None:
    table = blas.registered()
    for name in blas.REQUIRED:
        assert name in table
        assert llvm.address_of_symbol(f"rlx_{name}") == table[name].address != 0


def test_signatures_give_the_fortran_arity() -> None:
    assert blas.routine("sgemm").nargs == 13
    assert blas.routine("dgesv").nargs == 8
    assert blas.routine("dpotrf").nargs == 5
    assert blas.routine("sgemm").function_type() == ir.FunctionType(ir.VoidType(), [ir.PointerType()] * 13)


def test_other_routines_resolve_on_first_use() -> None:
    r = blas.routine("dsyrk")
    assert r.library == "cython_blas" and llvm.address_of_symbol("rlx_dsyrk") == r.address


def test_a_missing_routine_fails_loudly() -> None:
    with pytest.raises(RlxError, match="not exported"):
        blas.routine("no_such_routine")


def test_functions_with_a_return_value_are_refused_for_ir() -> None:
    with pytest.raises(RlxError, match="returns"):
        blas.routine("sdot").function_type()


def test_describe_status() -> None:
    assert blas.describe_status(int(blas.Status.NOT_POSITIVE_DEFINITE)) == "not positive definite"
    assert blas.describe_status(1 | 5 << 8) == "singular (batch slice 5)"
    assert blas.describe_status(4 | 1 << 8) == "index out of range (expert id of row 0)"
    assert blas.describe_status(4) == "index out of range"
    assert "unknown" in blas.describe_status(99)


@pytest.fixture
def saved_threads():
    """Restore the thread count a test changes."""
    before = threads.get_num_threads()
    yield before
    threads.set_num_threads(before)


def test_set_num_threads_governs_both_openblas_pools(saved_threads) -> None:
    threads.set_num_threads(1)
    pools = threads.pool_threads()
    assert len(pools) >= 2, pools  # SciPy's LP64 and NumPy's ILP64 builds
    assert set(pools.values()) == {1} and threads.get_num_threads() == 1
    threads.set_num_threads(2)
    assert set(threads.pool_threads().values()) == {2} and threads.get_num_threads() == 2


def test_without_threadpoolctl_the_library_symbols_are_used(saved_threads, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # import fails
    threads.set_num_threads(1)
    assert set(threads.pool_threads().values()) == {1}


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_set_num_threads_rejects_non_positive_ints(bad) -> None:
    with pytest.raises(ValueError):
        threads.set_num_threads(bad)


def test_the_default_is_openblas_own() -> None:
    """Untouched, the pools follow OPENBLAS_NUM_THREADS (here set in a fresh process)."""
    code = textwrap.dedent("""
        from rlx_llvm.kernels import threads
        print(sorted(set(threads.pool_threads().values())), threads.get_num_threads())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "OPENBLAS_NUM_THREADS": "1"})
    assert out.stdout.split() == ["[1]", "1"]
