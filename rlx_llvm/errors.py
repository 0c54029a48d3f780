"""The error hierarchy: every failure rlx_llvm raises on purpose is an RlxError."""
from __future__ import annotations


class RlxError(Exception):
    """Base of every error rlx_llvm raises on purpose."""


class ValidationError(RlxError, ValueError):
    """A schedule or thunk broke a bound; raised before any native code exists."""

    def __init__(self, message: str, *, index: int | None = None, kind: str | None = None,
                 field: str | None = None) -> None:
        self.index, self.kind, self.field = index, kind, field
        self.bare_message = message
        where = []
        if index is not None:
            where.append(f"thunk {index}")
        if kind is not None:
            where.append(kind)
        if field is not None:
            where.append(f"field {field!r}")
        super().__init__(f"{' '.join(where)}: {message}" if where else message)


    def at(self, index: int, kind: str) -> "ValidationError":
        """The same error, located at thunk `index` of kind `kind`."""
        return type(self)(self.bare_message, index=index, kind=kind, field=self.field)


class UnsupportedThunkError(RlxError, NotImplementedError):
    """The schedule holds thunks that have no lowering yet (all of them are listed)."""

    def __init__(self, missing: list[tuple[int, str]]) -> None:
        self.missing = missing
        listed = ", ".join(f"{i}:{k}" for i, k in missing)
        super().__init__(f"{len(missing)} thunk(s) have no lowering yet: {listed}")


class ExecutionError(RlxError, RuntimeError):
    """A native step reported a failure status at run time (e.g. a singular matrix)."""

    def __init__(self, message: str, *, index: int | None = None, kind: str | None = None,
                 status: int | None = None) -> None:
        self.index, self.kind, self.status = index, kind, status
        prefix = f"thunk {index} {kind}: " if index is not None else ""
        super().__init__(prefix + message)
