"""Makes tests/data/seed_thunks.json: the `pub enum Thunk` of the RLX seed, as the model tests need it.

Run by hand whenever the seed changes (the tests read only the JSON, so a fresh clone needs no seed):

    python tests/data/make_seed_thunks.py [path/to/types.rs]    # default: ../shared/seed/types.rs

It stores `kinds`: every variant in declaration order (one a line), mapped to its fields in order as
[field, Rust type] pairs, the type spelled as in the seed (comments dropped).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

DEFAULT_SEED = Path(__file__).resolve().parents[3] / "shared" / "seed" / "types.rs"
OUT = Path(__file__).with_name("seed_thunks.json")

Variant = tuple[str, list[tuple[str, str]]]


def enum_body(text: str, header: str = "pub enum Thunk {") -> str:
    """The text between the braces of the enum that `header` opens."""
    body = text[text.index(header) + len(header):]
    depth = 1
    for end, ch in enumerate(body):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return body[:end]
    raise ValueError(f"unbalanced braces after {header!r}")


def parse_seed(text: str) -> list[Variant]:
    """[(variant, [(field, rust type)])] of `pub enum Thunk` in declaration order."""
    variants: list[Variant] = []
    current: "Variant | None" = None
    for raw in enum_body(text).splitlines():
        line = re.sub(r"//.*$", "", raw).strip()
        if not line:
            continue
        if current is None:
            name, brace = re.fullmatch(r"(\w+)\s*(\{)?,?", line).groups()
            current = (name, [])
            if not brace:
                variants.append(current)
                current = None
        elif line.startswith("}"):
            variants.append(current)
            current = None
        else:
            field, typ = re.fullmatch(r"(\w+):\s*(.+?),?", line).groups()
            current[1].append((field, typ))
    return variants


def main(seed: Path = DEFAULT_SEED) -> None:
    """Parse `seed` and write OUT."""
    variants = parse_seed(seed.read_text())
    kinds = ",\n".join(f"  {json.dumps(name)}: {json.dumps(fields)}" for name, fields in variants)
    made_by = "tests/data/make_seed_thunks.py from the RLX seed's rlx_cpu/thunk/types.rs (pub enum Thunk)"
    OUT.write_text(f'{{"made_by": {json.dumps(made_by)},\n "kinds": {{\n{kinds}\n }}}}\n')
    print(f"wrote {OUT}: {len(variants)} kinds")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_SEED)
