"""LLVM IR emitters: one module per thunk family, each registering its lowerings in
`rlx_llvm.registry` (whose `FAMILIES` lists them and whose `load_all()` imports them)."""
