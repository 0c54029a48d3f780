"""What lives outside LLVM IR: the BLAS/LAPACK symbol table, BLAS thread control, SciPy/NumPy fallbacks."""
