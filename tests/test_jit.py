"""The JIT layer: verification before optimization, unresolved externals, the object cache."""
import subprocess
import sys
import textwrap

import pytest

from rlx_llvm import RlxError, jit
from rlx_llvm.cache import ObjectCache

GOOD = textwrap.dedent("""
    define i32 @answer(ptr %p) {
      ret i32 42
    }
""")


def test_host_has_vectors():
    h = jit.host()
    assert h.vector_bits in (128, 256, 512)
    assert h.lanes(32) == h.vector_bits // 32


def test_compile_and_load_runs():
    import ctypes
    code = jit.compile_ir(GOOD, cache=None)
    eng = jit.Engine()
    eng.load(code)
    fn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)(eng.address("answer"))
    assert fn(None) == 42
    with pytest.raises(RlxError, match="not in the loaded object"):
        eng.address("missing")


def test_invalid_ir_is_an_error_not_an_abort():
    # Running O3 on unverified bad IR aborts the process (LLVM assertions are on); we verify first.
    bad = "declare float @llvm.fma.f32(float, float)\ndefine float @f(float %x) {\n" \
          "  %r = call float @llvm.fma.f32(float %x, float %x)\n  ret float %r\n}\n"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        from rlx_llvm import jit, RlxError
        try:
            jit.compile_ir({bad!r}, cache=None)
        except RlxError as e:
            print("clean error:", str(e)[:60])
        """)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "clean error" in proc.stdout


def test_unresolved_external_is_refused_before_loading():
    ir_text = "declare void @rlx_no_such_symbol()\ndefine void @f() {\n  call void @rlx_no_such_symbol()\n" \
              "  ret void\n}\n"
    with pytest.raises(RlxError, match="unresolved external"):
        jit.compile_ir(ir_text, cache=None)


def test_object_cache_round_trip(tmp_path):
    cache = ObjectCache(tmp_path)
    first = jit.compile_ir(GOOD, cache=cache)
    assert not first.from_cache
    second = jit.compile_ir(GOOD, cache=cache)
    assert second.from_cache and second.object == first.object
    assert second.optimized_ir == first.optimized_ir


def test_corrupt_cache_entry_is_ignored(tmp_path):
    cache = ObjectCache(tmp_path)
    code = jit.compile_ir(GOOD, cache=cache)
    obj = next(tmp_path.rglob("*.o"))
    obj.write_bytes(b"garbage")
    again = jit.compile_ir(GOOD, cache=cache)
    assert not again.from_cache and again.object == code.object


def test_cache_key_depends_on_ir_and_options():
    assert jit.cache_key(GOOD, 3) != jit.cache_key(GOOD, 2)
    assert jit.cache_key(GOOD, 3) != jit.cache_key(GOOD + "\n", 3)


def test_engines_outlive_each_other():
    # Each Engine owns its TargetMachine: dropping one must not break another.
    import ctypes
    import gc
    code = jit.compile_ir(GOOD, cache=None)
    a, b = jit.Engine(), jit.Engine()
    a.load(code)
    b.load(code)
    fn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)(b.address("answer"))
    del a
    gc.collect()
    assert fn(None) == 42


def test_remarks_switch_prints_vectorizer_remarks():
    """RLX_LLVM_REMARKS=1 makes LLVM print its vectorizer remarks to stderr."""
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = "import rlx_llvm as rl\nfrom tests.test_program import gelu_schedule\n" \
           "rl.compile(gelu_schedule(), cache=False)\n"
    env = dict(os.environ, RLX_LLVM_REMARKS="1", PYTHONPATH=root)
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "remark:" in proc.stderr and "vectoriz" in proc.stderr
    quiet = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, RLX_LLVM_REMARKS="0", PYTHONPATH=root))
    assert "remark:" not in quiet.stderr


def test_half_libcalls_resolve():
    """libgcc_s is loaded so generic-target half conversions never link to NULL."""
    import llvmlite.binding as llvm
    jit.initialize()
    assert llvm.address_of_symbol("__extendhfsf2") and llvm.address_of_symbol("__truncsfhf2")
