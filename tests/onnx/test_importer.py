"""The ONNX importer: shape arithmetic folds at import, math ops match ONNX Runtime, errors list every node."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP, helper as h, numpy_helper as nh  # noqa: E402

import rlx_llvm as rl  # noqa: E402
from rlx_llvm.cli import main  # noqa: E402

RNG = np.random.default_rng(3)


def model(nodes, inputs, outputs, inits=(), opset=17):
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                     [h.make_tensor_value_info(o, TP.UNDEFINED, None) for o in outputs],
                     [nh.from_array(a, n) for n, a in inits])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def ort_run(m, feeds):
    import onnxruntime as ort
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def reference_run(m, feeds):
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(m).run(None, feeds)


@pytest.fixture(scope="module")
def transformer_block():
    """A block as exporters write it: dynamic batch/seq, shape arithmetic, MatMul + Add, LayerNorm, GELU, Softmax."""
    H = 16
    w = {n: RNG.standard_normal(s).astype(np.float32) * 0.3 for n, s in
         [("Wq", (H, H)), ("Wk", (H, H)), ("bq", (H,)), ("W1", (H, 32)), ("W2", (32, H)), ("g", (H,)), ("b", (H,))]}
    nodes = [
        h.make_node("Shape", ["x"], ["shape"]),
        h.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        h.make_node("Unsqueeze", ["batch", "zero1"], ["batch1"]),
        h.make_node("Concat", ["batch1", "minus1", "hdim"], ["newshape"], axis=0),
        h.make_node("MatMul", ["x", "Wq"], ["q0"]), h.make_node("Add", ["q0", "bq"], ["q"]),
        h.make_node("MatMul", ["x", "Wk"], ["k"]),
        h.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        h.make_node("MatMul", ["q", "kt"], ["s0"]), h.make_node("Div", ["s0", "four"], ["s"]),
        h.make_node("Softmax", ["s"], ["p"], axis=-1),
        h.make_node("MatMul", ["p", "x"], ["a"]), h.make_node("Add", ["a", "x"], ["r"]),
        h.make_node("LayerNormalization", ["r", "g", "b"], ["n"], axis=-1, epsilon=1e-5),
        h.make_node("MatMul", ["n", "W1"], ["f0"]), h.make_node("Gelu", ["f0"], ["f1"]),
        h.make_node("MatMul", ["f1", "W2"], ["f2"]),
        h.make_node("Reshape", ["f2", "newshape"], ["y"]),
        h.make_node("ReduceMean", ["y", "axes1"], ["pooled"], keepdims=0),
    ]
    consts = [("zero", np.array(0, np.int64)), ("zero1", np.array([0], np.int64)),
              ("minus1", np.array([-1], np.int64)), ("hdim", np.array([H], np.int64)),
              ("four", np.array(4.0, np.float32)), ("axes1", np.array([1], np.int64))]
    m = model(nodes, [("x", TP.FLOAT, ["batch", "seq", H])], ["y", "pooled"], list(w.items()) + consts, opset=20)
    return m, rl.onnx.OnnxModel(m)


@pytest.mark.parametrize("shape", [(1, 1), (2, 5), (3, 17)])
def test_transformer_block_matches_onnxruntime(transformer_block, shape):
    m, om = transformer_block
    x = RNG.standard_normal((*shape, 16)).astype(np.float32)
    got = om.run({"x": x})
    for a, b in zip(got, reference_run(m, {"x": x})):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(b).max())))
    cg = om.compiled({"x": x.shape})
    kinds = {type(t).__name__ for t in cg.schedule.thunks}
    assert "FusedResidualLN" in kinds and "Softmax" in kinds and not any("Shape" in k for k in kinds)


def test_shape_arithmetic_folds_and_initializers_become_params(transformer_block):
    _, om = transformer_block
    g = rl.onnx.load(om.proto, shapes={"x": (2, 3, 16)})
    assert {"Wq", "Wk", "W1", "W2"} <= set(g.params)
    assert "g" not in g.params            # 16 elements: baked as a constant
    assert all(n.op not in ("Shape", "Concat") for n in g.nodes)


def test_gemm_and_activations_match_reference():
    A = RNG.standard_normal((5, 7)).astype(np.float32)
    nodes = [h.make_node("Gemm", ["x", "A", "c"], ["g"], alpha=0.5, beta=2.0, transB=1),
             h.make_node("LeakyRelu", ["g"], ["l"], alpha=0.1), h.make_node("Elu", ["g"], ["e"], alpha=0.7),
             h.make_node("HardSigmoid", ["g"], ["hs"]), h.make_node("Clip", ["g", "lo", "hi"], ["cl"]),
             h.make_node("Max", ["g", "l", "e"], ["mx"]), h.make_node("Selu", ["g"], ["se"]),
             h.make_node("LogSoftmax", ["g"], ["ls"], axis=1), h.make_node("ReduceL2", ["g"], ["r2"], keepdims=1),
             h.make_node("ReduceLogSumExp", ["g"], ["lse"], axes=[1], keepdims=0),
             h.make_node("Less", ["g", "e"], ["cond"]), h.make_node("Where", ["cond", "g", "e"], ["w"]),
             h.make_node("Abs", ["g"], ["sq"]), h.make_node("Sqrt", ["sq"], ["sr"])]
    m = model(nodes, [("x", TP.FLOAT, [3, 7])], ["l", "e", "hs", "cl", "mx", "se", "ls", "r2", "lse", "w", "sr"],
              [("A", A), ("c", RNG.standard_normal(5).astype(np.float32)), ("lo", np.array(-0.5, np.float32)),
               ("hi", np.array(0.5, np.float32))])
    x = RNG.standard_normal((3, 7)).astype(np.float32)
    for a, b in zip(rl.onnx.run(m, {"x": x}), reference_run(m, {"x": x})):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_slices_splits_gathers_and_expand():
    nodes = [h.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["sl"]),
             h.make_node("Split", ["x", "sizes"], ["p0", "p1"], axis=2),
             h.make_node("Gather", ["x", "idx"], ["ga"], axis=1),
             h.make_node("Expand", ["row", "eshape"], ["ex"]),
             h.make_node("Flatten", ["x"], ["fl"], axis=2), h.make_node("Squeeze", ["one", "sqax"], ["sq"]),
             h.make_node("Tile", ["row", "reps"], ["ti"])]
    m = model(nodes, [("x", TP.FLOAT, [2, 3, 6]), ("row", TP.FLOAT, [1, 6]), ("one", TP.FLOAT, [1, 4, 1])],
              ["sl", "p0", "p1", "ga", "ex", "fl", "sq", "ti"],
              [("st", np.array([0, 5], np.int64)), ("en", np.array([2, -100], np.int64)),
               ("ax", np.array([1, 2], np.int64)), ("sp", np.array([1, -2], np.int64)),
               ("sizes", np.array([2, 4], np.int64)), ("idx", np.array([[2, -1], [0, 1]], np.int64)),
               ("eshape", np.array([3, 1, 6], np.int64)), ("sqax", np.array([0, 2], np.int64)),
               ("reps", np.array([2, 3], np.int64))], opset=18)
    feeds = {"x": RNG.standard_normal((2, 3, 6)).astype(np.float32), "row": RNG.standard_normal((1, 6)).astype(np.float32),
             "one": RNG.standard_normal((1, 4, 1)).astype(np.float32)}
    for a, b in zip(rl.onnx.run(m, feeds), reference_run(m, feeds)):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def test_every_unsupported_node_is_listed_at_once():
    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Unique", ["r"], ["a"], name="un"),
             h.make_node("Det", ["x"], ["d"], name="det"), h.make_node("Gelu", ["x"], ["ge"], approximate="cubic"),
             h.make_node("Relu", ["a"], ["z"])]
    m = model(nodes, [("x", TP.FLOAT, [3, 3])], ["z", "d", "ge"])
    with pytest.raises(rl.onnx.OnnxImportError) as err:
        rl.onnx.load(m)
    text = str(err.value)
    assert "3 ONNX node(s)" in text
    assert "Unique 'un': op 'Unique'" in text and "Det 'det'" in text and "approximate='cubic'" in text


def test_symbolic_dims_need_shapes():
    m = model([h.make_node("Relu", ["x"], ["y"])], [("x", TP.FLOAT, ["n", 3])], ["y"])
    with pytest.raises(rl.GraphError, match="symbolic dims"):
        rl.onnx.load(m)
    g = rl.onnx.load(m, shapes={"x": (4, 3)})
    assert g.shape_of(g.outputs[0]) == ([4, 3], "f32")
    with pytest.raises(rl.GraphError, match="does not fit"):
        rl.onnx.load(m, shapes={"x": (4, 2)})


def test_cli_runs_a_model(tmp_path, capsys):
    m = model([h.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", TP.FLOAT, [2, 3])], ["y"])
    path, x = tmp_path / "m.onnx", RNG.standard_normal((2, 3)).astype(np.float32)
    onnx.save(m, str(path))
    np.save(tmp_path / "x.npy", x)
    assert main(["onnx", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--repeat", "2",
                 "--out", str(tmp_path / "out"), "--report"]) == 0
    out = capsys.readouterr().out
    assert "y: [2, 3] float32" in out and "Softmax" in out
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), reference_run(m, {"x": x})[0], rtol=1e-6)
    assert main(["onnx", str(path), "--input", "x"]) == 2


@pytest.mark.parametrize("eq, shapes", [("ij,jk->ik", [(2, 3), (3, 4)]), ("bij,bjk->bik", [(2, 2, 3), (2, 3, 4)]),
                                        ("ij,kj", [(2, 3), (4, 3)]), ("i,i", [(5,), (5,)])])
def test_einsum_matches_numpy(eq, shapes):
    names = [f"x{i}" for i in range(len(shapes))]
    m = model([h.make_node("Einsum", names, ["y"], equation=eq)],
              [(n, TP.FLOAT, list(s)) for n, s in zip(names, shapes)], ["y"], opset=13)
    xs = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    y, = rl.onnx.run(m, dict(zip(names, xs)))
    np.testing.assert_allclose(y, np.einsum(eq, *xs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attrs", [dict(strides=[2, 1, 2], pads=[1, 0, 1, 0, 1, 1]),
                                   dict(strides=[2, 2, 1], dilations=[2, 1, 1], output_padding=[1, 0, 0])],
                         ids=["strided-padded", "dilated-output-padding"])
def test_conv_transpose_3d_matches_the_reference(attrs):
    x = RNG.standard_normal((2, 4, 3, 4, 5)).astype(np.float32)
    w = RNG.standard_normal((4, 3, 3, 2, 3)).astype(np.float32)
    b = RNG.standard_normal(3).astype(np.float32)
    m = model([h.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)], [("x", TP.FLOAT, list(x.shape))],
              ["y"], [("w", w), ("b", b)])
    want, = reference_run(m, {"x": x})
    got, = rl.onnx.run(m, {"x": x})
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_bf16_outputs_are_bfloat16_and_half_matmul_rounds_once():
    import ml_dtypes
    a = RNG.standard_normal((3, 8)).astype(ml_dtypes.bfloat16)
    bm = RNG.standard_normal((8, 4)).astype(ml_dtypes.bfloat16)
    m = model([h.make_node("MatMul", ["a", "b"], ["y"])], [("a", TP.BFLOAT16, [3, 8])], ["y"], [("b", bm)])
    got, = rl.onnx.run(m, {"a": a})
    assert got.dtype == ml_dtypes.bfloat16
    exact = (a.astype(np.float32) @ bm.astype(np.float32)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got.view(np.uint16), exact.view(np.uint16))


@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn_matches_onnxruntime(size):
    # onnx.reference's LRN loops over the batch dim instead of the channels; ONNX Runtime follows the spec
    x = RNG.standard_normal((2, 6, 3, 3)).astype(np.float32)
    m = model([h.make_node("LRN", ["x"], ["y"], size=size, alpha=0.01, beta=0.6, bias=2.0)],
              [("x", TP.FLOAT, list(x.shape))], ["y"])
    m.graph.output[0].type.tensor_type.elem_type = TP.FLOAT
    want, = ort_run(m, {"x": x})
    got, = rl.onnx.run(m, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
