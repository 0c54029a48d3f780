"""The reference of CustomOp: the registered kernel itself, called through its C ABI on arena views
(an IR kernel compiled on its own, a C function, or the Python callable) — docs/custom-ops.md."""
from __future__ import annotations

import numpy as np

from .. import custom_ops
from .. import thunks as T
from ..errors import ExecutionError
from . import reference, view


@reference(T.CustomOp)
def custom_op(arena: np.ndarray, t: T.CustomOp) -> None:
    inputs = [view(arena, offset, np.float32, count) for offset, count, _ in t.inputs]
    out_offset, out_len, _ = t.output
    status = custom_ops.call(custom_ops.lookup(t.kernel), inputs, view(arena, out_offset, np.float32, out_len),
                             bytes(t.attrs))
    if status:
        message, cause = custom_ops.describe_failure(t, custom_ops.thunk_status(status))
        raise ExecutionError(message, kind="CustomOp", status=status) from cause
