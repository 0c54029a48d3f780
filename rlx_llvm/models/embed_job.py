"""Embedding a file of texts: `rlx-llvm embed --input FILE --output OUT` (docs/embedding.md).

Readers stream `(id, text)` records from `.txt` (a text a line), `.jsonl` (an object a line, its
`column`), `.csv` (a header row naming `column`) and `.parquet` (a string column; needs pyarrow).
A record that cannot be read — not UTF-8, not JSON, without the column, not a string — stops the job
or, with `errors="skip"`, is skipped and counted.  A first pass reads the whole input, so a bad input
is refused before anything is written and the progress bar knows its total.

The texts are embedded in fixed chunks: chunk k is always kept texts k·chunk_size … (k+1)·chunk_size − 1,
whenever the run started, and each chunk runs through `SentenceEncoder.embed_iter` the same way.  A
chunk's vectors and ids go to `OUT.partial/` as `.npy` files, fsync'ed, then one line in
`OUT.partial/journal.jsonl` records it (with the files' SHA-256).  `resume=True` checks the journal's
settings and chunk files and carries on after the last recorded chunk.  OUT is assembled from the
chunks only at the end, written inside `OUT.partial/` and renamed over OUT, so OUT never looks
complete when it is not, and a resumed run's OUT is byte for byte an uninterrupted run's.
"""
from __future__ import annotations

import codecs
import csv
import hashlib
import io
import json
import os
import shutil
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Literal

import numpy as np

from ..progress import ProgressBar

if TYPE_CHECKING:
    from .sentence import SentenceEncoder

INPUTS = (".txt", ".jsonl", ".csv", ".parquet")
OUTPUTS = (".npy", ".parquet")
CHUNK_SIZE = 2048      # texts per chunk: the unit that is written, journaled and resumed
JOURNAL = "journal.jsonl"
JOURNAL_VERSION = 1
Errors = Literal["skip", "fail"]


class InputError(ValueError):
    """The input or output cannot be used as asked; the message names the file, the place and why."""


@dataclass(frozen=True)
class BadRecord:
    """A record that cannot be read: where it is and why."""

    where: str
    why: str


Record = tuple[int, "str | BadRecord"]


# ── readers ──
def _lines(path: Path) -> Iterator[tuple[int, "str | BadRecord"]]:
    """The file's lines numbered from 1, decoded as UTF-8 (a byte-order mark before the first dropped)."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            raw = raw.removesuffix(b"\n").removesuffix(b"\r")
            if number == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield number, BadRecord(f"line {number}", f"not UTF-8 (byte 0x{raw[exc.start]:02x} at byte "
                                                          f"{exc.start + 1} of the line)")


def _string(value: object, where: str, column: str) -> "str | BadRecord":
    """A field's value as text: a str, or bytes that are UTF-8."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            return BadRecord(where, f"{column!r} is not UTF-8 (byte 0x{value[exc.start]:02x} at byte {exc.start + 1})")
    if isinstance(value, str):
        return value
    return BadRecord(where, f"{column!r} is {'null' if value is None else type(value).__name__}, not a string")


def _read_txt(path: Path, column: str) -> Iterator[Record]:
    for number, line in _lines(path):
        yield number - 1, line


def _read_jsonl(path: Path, column: str) -> Iterator[Record]:
    for number, line in _lines(path):
        where = f"line {number}"
        if isinstance(line, BadRecord):
            yield number - 1, line
            continue
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            yield number - 1, BadRecord(where, f"not JSON ({exc.msg} at column {exc.colno})")
            continue
        if not isinstance(obj, dict):
            yield number - 1, BadRecord(where, f"a JSON {type(obj).__name__}, not an object")
        elif column not in obj:
            yield number - 1, BadRecord(where, f"no key {column!r} (keys: {', '.join(obj) or 'none'}); "
                                               f"choose one with --column")
        else:
            yield number - 1, _string(obj[column], where, column)


def _csv_header(path: Path) -> list[str]:
    """The header row of a CSV file."""
    for _, line in _lines(path):
        if isinstance(line, BadRecord):
            raise InputError(f"{path} header line: {line.why}")
        return next(csv.reader([line]), [])
    raise InputError(f"{path} is empty: a CSV input needs a header row naming its columns")


def _read_csv(path: Path, column: str) -> Iterator[Record]:
    index = _csv_header(path).index(column)
    undecodable: list[BadRecord] = []
    line = [1]  # the number of the last line read (the header is line 1)

    def decoded_lines() -> Iterator[str]:
        for number, text in islice(_lines(path), 1, None):
            line[0] = number
            if isinstance(text, BadRecord):
                undecodable.append(text)
            else:
                yield text + "\n"

    record = 0
    try:
        for row in csv.reader(decoded_lines()):
            for bad in undecodable:   # lines that could not be decoded, read while reading this row
                yield record, bad
                record += 1
            undecodable.clear()
            if row:                   # a blank line is no record
                yield record, row[index] if index < len(row) else \
                    BadRecord(f"line {line[0]}", f"{len(row)} fields, no value for {column!r}")
                record += 1
    except csv.Error as exc:
        raise InputError(f"{path} line {line[0]}: not CSV ({exc})") from None
    for bad in undecodable:
        yield record, bad
        record += 1


def _parquet():
    """pyarrow.parquet, or an InputError saying how to install it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError("Parquet files need pyarrow: pip install 'rlx-llvm[parquet]'") from None
    return pq


def _parquet_columns(path: Path) -> list[str]:
    try:
        return _parquet().read_schema(path).names
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 — pyarrow's errors for a file that is not Parquet vary
        raise InputError(f"{path} is not a readable Parquet file ({' '.join(str(exc).split())})") from None


def _read_parquet(path: Path, column: str) -> Iterator[Record]:
    row = 0
    for batch in _parquet().ParquetFile(path).iter_batches(columns=[column], batch_size=4096):
        for value in batch.column(0).to_pylist():
            yield row, _string(value, f"row {row + 1}", column)
            row += 1


READERS = {".txt": _read_txt, ".jsonl": _read_jsonl, ".csv": _read_csv, ".parquet": _read_parquet}
TABLE_COLUMNS = {".csv": _csv_header, ".parquet": _parquet_columns}


@dataclass(frozen=True)
class TextSource:
    """An input file of texts: checked on creation (exists, a known kind, has the column)."""

    path: Path
    column: str = "text"

    def __post_init__(self) -> None:
        if not self.path.exists():
            raise InputError(f"input {self.path} does not exist")
        if not self.path.is_file():
            raise InputError(f"input {self.path} is not a file")
        if self.kind not in READERS:
            raise InputError(f"input {self.path}: unknown kind {self.kind or '(no extension)'!r}; "
                             f"expected one of {', '.join(INPUTS)}")
        if self.kind in TABLE_COLUMNS:
            columns = TABLE_COLUMNS[self.kind](self.path)
            if self.column not in columns:
                raise InputError(f"input {self.path} has no column {self.column!r} (columns: "
                                 f"{', '.join(columns) or 'none'}); choose one with --column")

    @property
    def kind(self) -> str:
        """The file's extension, lower case: which reader reads it."""
        return self.path.suffix.lower()

    def records(self) -> Iterator[Record]:
        """Every record in file order: (id, text) or (id, BadRecord)."""
        return READERS[self.kind](self.path, self.column)

    def texts(self) -> Iterator[tuple[int, str]]:
        """The readable records, in file order."""
        return ((i, t) for i, t in self.records() if not isinstance(t, BadRecord))

    def scan(self, errors: Errors) -> tuple[int, int]:
        """(readable texts, skipped records) after reading the whole file; the first bad record is an
        InputError unless `errors` is "skip"."""
        good = skipped = 0
        for _, text in self.records():
            if not isinstance(text, BadRecord):
                good += 1
            elif errors == "skip":
                skipped += 1
            else:
                raise InputError(f"{self.path} {text.where}: {text.why} (--errors skip skips such records)")
        return good, skipped


# ── the chunk journal ──
def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path: Path, data: bytes) -> str:
    """Write `path` whole (a temporary file fsync'ed, then renamed); returns its SHA-256."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return hashlib.sha256(data).hexdigest()


def _npy_bytes(array: np.ndarray) -> bytes:
    header = {"descr": np.lib.format.dtype_to_descr(array.dtype), "fortran_order": False, "shape": array.shape}
    return _npy_header(header) + np.ascontiguousarray(array).tobytes()


def _npy_header(header: dict) -> bytes:
    """An .npy header exactly as `np.save` writes it (format 1.0)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue()


def chunk_files(folder: Path, index: int) -> dict[str, Path]:
    """The vectors and ids files of chunk `index`."""
    return {part: folder / f"{index:06d}.{part}.npy" for part in ("vectors", "ids")}


@dataclass(frozen=True)
class Chunk:
    """One journaled chunk: its index, text count, truncated-text count and files' SHA-256."""

    index: int
    count: int
    truncated: int
    sha256: dict[str, str]

    def intact(self, folder: Path) -> bool:
        """Its files are there with the recorded contents."""
        return all(p.is_file() and hashlib.sha256(p.read_bytes()).hexdigest() == self.sha256[part]
                   for part, p in chunk_files(folder, self.index).items())


class Journal:
    """The side folder OUT.partial/: chunk files and the journal that records each finished chunk."""

    def __init__(self, folder: Path, settings: dict, chunks: list[Chunk]) -> None:
        self.folder, self.settings, self.chunks = folder, settings, chunks

    @classmethod
    def start(cls, folder: Path, settings: dict, resume: bool) -> "Journal":
        """A new journal, or with `resume` the recorded one (its intact leading chunks) if there is one."""
        if folder.exists() and not resume:
            raise InputError(f"{folder} holds an unfinished run: pass --resume to continue it, or delete it")
        if folder.exists():
            journal = cls(folder, settings, cls._recorded(folder, settings))
        else:
            try:
                folder.mkdir()
            except OSError as exc:
                raise InputError(f"cannot write the output: {folder}: {exc.strerror or exc}") from None
            journal = cls(folder, settings, [])
        journal._rewrite()
        return journal

    @staticmethod
    def _recorded(folder: Path, settings: dict) -> list[Chunk]:
        """The chunks the journal records, up to the first torn line or damaged chunk."""
        path = folder / JOURNAL
        lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
        try:
            recorded = json.loads(lines[0]) if lines else settings
        except json.JSONDecodeError:
            recorded = {}
        differ = sorted(k for k in settings.keys() | recorded.keys() if settings.get(k) != recorded.get(k))
        if differ:
            raise InputError(f"{folder} was written with other settings ({', '.join(differ)} differ); run "
                             f"without --resume after deleting it to start over")
        chunks: list[Chunk] = []
        for line in lines[1:]:
            try:
                chunk = Chunk(**json.loads(line))
            except (json.JSONDecodeError, TypeError):
                break
            if chunk.index != len(chunks) or not chunk.intact(folder):
                break
            chunks.append(chunk)
        return chunks

    def _rewrite(self) -> None:
        """The journal file rewritten whole: settings, then each kept chunk."""
        lines = [self.settings] + [c.__dict__ for c in self.chunks]
        _write_durably(self.folder / JOURNAL, "".join(json.dumps(x) + "\n" for x in lines).encode())
        _fsync_dir(self.folder)

    @property
    def texts_done(self) -> int:
        return sum(c.count for c in self.chunks)

    def add(self, ids: np.ndarray, vectors: np.ndarray, truncated: int) -> None:
        """Write one chunk's files durably, then record it in the journal."""
        files = chunk_files(self.folder, len(self.chunks))
        arrays = {"vectors": vectors.astype("<f4"), "ids": ids.astype("<i8")}
        chunk = Chunk(len(self.chunks), len(ids), truncated,
                      {part: _write_durably(files[part], _npy_bytes(a)) for part, a in arrays.items()})
        _fsync_dir(self.folder)
        with open(self.folder / JOURNAL, "a", encoding="utf-8") as f:
            f.write(json.dumps(chunk.__dict__) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.chunks.append(chunk)

    def parts(self, part: str) -> Iterator[np.ndarray]:
        """Each chunk's vectors or ids, in order."""
        return (np.load(chunk_files(self.folder, c.index)[part]) for c in self.chunks)

    def finish(self, output: Path, dim: int) -> None:
        """Assemble OUT from the chunks (written in the side folder, renamed over OUT), then remove the folder."""
        tmp = self.folder / ("assembled" + output.suffix)
        (_assemble_npy if output.suffix.lower() == ".npy" else _assemble_parquet)(self, tmp, dim)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, output)
        _fsync_dir(output.parent)
        shutil.rmtree(self.folder)


def _assemble_npy(journal: Journal, path: Path, dim: int) -> None:
    rows = journal.texts_done
    with open(path, "wb") as f:
        f.write(_npy_header({"descr": "<f4", "fortran_order": False, "shape": (rows, dim)}))
        for vectors in journal.parts("vectors"):
            f.write(vectors.tobytes())


def _assemble_parquet(journal: Journal, path: Path, dim: int) -> None:
    import pyarrow as pa
    schema = pa.schema([("id", pa.int64()), ("vector", pa.list_(pa.float32(), dim))])
    with _parquet().ParquetWriter(path, schema) as writer:
        for ids, vectors in zip(journal.parts("ids"), journal.parts("vectors")):
            column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), dim)
            writer.write_table(pa.table([pa.array(ids), column], schema=schema))


# ── the job ──
@dataclass(frozen=True)
class Summary:
    """What an embedding job did."""

    output: Path
    texts: int
    dim: int
    truncated: int
    max_length: int
    skipped: int
    resumed: int      # texts already done when the run (re)started
    seconds: float

    @property
    def texts_per_s(self) -> float:
        """Texts embedded by this run per second."""
        return (self.texts - self.resumed) / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        resumed = f", {self.resumed} of them from the interrupted run" if self.resumed else ""
        return (f"embedded {self.texts} texts{resumed} in {self.seconds:.1f} s ({self.texts_per_s:.0f} texts/s); "
                f"{self.truncated} truncated to {self.max_length} tokens, {self.skipped} skipped; "
                f"wrote {self.output} [{self.texts}, {self.dim}] float32")


def check_output(output: Path) -> Path:
    """The output path: a known kind in an existing folder, not itself a folder."""
    if output.suffix.lower() not in OUTPUTS:
        raise InputError(f"output {output}: unknown kind {output.suffix or '(no extension)'!r}; expected one of "
                         f"{', '.join(OUTPUTS)}")
    if output.suffix.lower() == ".parquet":
        _parquet()
    if not output.parent.is_dir():
        raise InputError(f"cannot write the output {output}: {output.parent} is not a folder")
    if output.is_dir():
        raise InputError(f"cannot write the output {output}: it is a folder")
    return output


def partial_folder(output: Path) -> Path:
    """Where a run keeps its chunks until OUT is complete: OUT.partial/ beside OUT."""
    return output.with_name(output.name + ".partial")


def truncated_count(encoder: "SentenceEncoder", texts: list[str]) -> int:
    """How many texts have more tokens than the encoder's window (and so are truncated)."""
    return sum(len(e.ids) > encoder.max_length for e in encoder.tokenizer.encode_batch(texts))


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def embed_file(encoder: "SentenceEncoder", input: "str | Path", output: "str | Path", column: str = "text",
               batch_size: int = 32, chunk_size: int = CHUNK_SIZE, errors: Errors = "fail", resume: bool = False,
               progress: bool = True) -> Summary:
    """Embed every text of `input` into `output` (.npy float32 [n, dim], or .parquet id + vector),
    in resumable chunks; bad input or output is an InputError before anything is written."""
    if batch_size < 1 or chunk_size < 1:
        raise InputError(f"batch size and chunk size must be ≥ 1, got {batch_size} and {chunk_size}")
    output = check_output(Path(output))
    try:
        source = TextSource(Path(input), column)
        total, skipped = source.scan(errors)
    except OSError as exc:
        raise InputError(f"cannot read the input {input}: {exc.strerror or exc}") from None
    stat = source.path.stat()
    settings = {"version": JOURNAL_VERSION, "input": str(source.path.resolve()), "input_bytes": stat.st_size,
                "input_mtime_ns": stat.st_mtime_ns, "column": column, "errors": errors,
                "model": str(encoder.path), "quant": encoder.quant, "max_length": encoder.max_length,
                "dim": encoder.dim, "batch_size": batch_size, "chunk_size": chunk_size, "output": output.suffix.lower()}
    journal = Journal.start(partial_folder(output), settings, resume)
    resumed = journal.texts_done
    t0 = time.perf_counter()
    bar = ProgressBar(total, resumed, progress, unit="texts")   # texts/s and ETA on stderr (rlx_llvm.progress)
    try:
        for chunk in _chunks(islice(source.texts(), resumed, None), chunk_size):
            ids, texts = np.array([i for i, _ in chunk], np.int64), [t for _, t in chunk]
            vectors = []
            for batch in encoder.embed_iter(texts, batch_size=batch_size):
                vectors.append(batch)
                bar.update(len(batch))
            journal.add(ids, np.concatenate(vectors), truncated_count(encoder, texts))
    finally:
        bar.close()
    journal.finish(output, encoder.dim)
    return Summary(output, journal.texts_done, encoder.dim, sum(c.truncated for c in journal.chunks),
                   encoder.max_length, skipped, resumed, time.perf_counter() - t0)
