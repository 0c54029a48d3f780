"""The 196 RLX CPU thunks as frozen dataclasses, one module per family.

    from rlx_llvm import thunks as T
    t = T.Sgemm(a=0, b=4096, c=8192, m=8, k=128, n=8)
    t.reads()    # (Extent(field='a', offset=0, nbytes=4096), Extent(field='b', offset=4096, nbytes=4096))
    t.writes()   # (Extent(field='c', offset=8192, nbytes=256),)

`ALL_THUNKS` maps every kind name to its class, in the seed's declaration order.
"""
from __future__ import annotations

from .elementwise import (
    ElementwiseRegion, SgdMomentum, ActivationF64, ComplexNormSqF32, ComplexNormSqBackwardF32,
    ConjugateC64, ActivationC64, BinaryFullF64, BinaryFullC64, BiasAdd, BinaryFull,
    ActivationInPlace, SplineActivation, Compare, Where, Fma)
from .casts import (
    CopyF64, CopyI64, CastF32ToI64, CastF32ToF64, CastF64ToF32, CastF64ToI64, CastF64ToI32,
    CastF64ToBool, CastI64ToI32, CastI64ToF64, CastI32ToF64, CastF32ToF16, CastF16ToF32,
    CastF32ToBf16, CastBf16ToF32, CastF32ToI32, CastI64ToF32, CastBoolToI32, CastBoolToF32,
    CastF32ToBool, CastI32ToF32, CastI32ToI64, CastI32ToBool, CastI64ToBool, CastBoolToI64,
    CastGeneric, Copy, RoundHalf)
from .gemm import (
    Sgemm, SgemmHalf, SgemmBf16, SgemmF16, SgemmT, CgemmC64, BatchedDgemmF64, BatchedSgemm, Dgemm,
    FusedMmBiasAct, SynthMatMul, LoraMatMul, GroupedMatMul)
from .linalg import (
    DenseSolveF64, DenseSolveF32, CholeskyF32, TriangularSolveF32, DetF32, SortF32, SvdF32, QrF32,
    BatchedDenseSolveF64, BatchedDenseSolveF32)
from .norms import (
    FusedResidualLN, FusedResidualRmsNorm, LayerNorm, GroupNorm, BatchNormInference, LayerNorm2d,
    RmsNorm, AdaLayerNorm, GatedResidual)
from .reductions import (
    ReduceSumF64, Softmax, Cumsum, CumScan, Reduce, Histogram, ArgReduce, TopK)
from .losses import (
    SoftmaxCrossEntropyDense, SoftmaxCrossEntropy, SoftmaxCrossEntropyBackward)
from .movement import (
    TransposeF64, ConcatF64, Gather, Narrow, Reverse, ResizeNearest2x, Interpolate3d, KvAppend,
    Concat, ScatterAdd, ScatterNd, ScatterElements, GatherNd, GatherElements, Transpose, GatherAxis)
from .attention import (
    AxialRope2d, Attention, AttentionBackward, AttentionBackwardAll, Rope, FusedAttnBlock,
    FusedBertLayer, FusedNomicLayer, FusedSwiGLU)
from .conv import (
    ConvTranspose2d, Conv3d, ConvTranspose3d, Conv2D1x1, Pool2D, Pool3D, Conv2D, Im2Col)
from .quant import (
    DequantMatMul, DequantMatMulGguf, DequantMatMulInt4, DequantMatMulFp8, DequantMatMulNvfp4,
    DequantMatMulMxFp4x2, DequantMatMulMlx, ScaledMatMul, ScaledGroupedMatMul, ScaledQuantize,
    ScaledQuantScale, ScaledDequantize, DequantGroupedMatMulGguf, DequantGroupedMatMulMlx,
    DequantMoEWeightsGguf, QMatMul, QConv2d, Quantize, Dequantize, FakeQuantize,
    FakeQuantizeBackward, FakeQuantizeLSQ, FakeQuantizeLSQBackwardX, FakeQuantizeLSQBackwardScale)
from .recurrent import (
    SelectiveScan, GatedDeltaNetBackward, GatedDeltaNet, Lstm, Gru, Rnn, Mamba2)
from .control import (
    Nop, Scan, ScanBackward, ScanBackwardXs, CustomFn, CustomOp)
from .signal import (
    Fft1d, Fft1dQ, FftButterflyStage, LogMel, LogMelBackward, WelchPeaks)
from .rng import (
    Sample, RngNormal, RngUniform)
from .backward import (
    BatchNormInferenceBackwardInput, BatchNormInferenceBackwardGamma,
    BatchNormInferenceBackwardBeta, AdaLayerNormBackward, GatedResidualBackward, ReluBackward,
    ReluBackwardF64, ActivationBackward, ActivationBackwardF64, LayerNormBackwardInput,
    LayerNormBackwardGamma, RmsNormBackwardInput, RmsNormBackwardGamma, RmsNormBackwardBeta,
    RopeBackward, CumsumBackward, GatherBackward, GroupNormBackwardInput, GroupNormBackwardGamma,
    GroupNormBackwardBeta, MaxPool2dBackward, Conv2dBackwardInput, Conv2dBackwardWeight,
    MaxPool3dBackward, Conv3dBackwardInput, Conv3dBackwardWeight)
from .splat import (
    GaussianSplatRender, GaussianSplatRenderBackward, GaussianSplatPrepare, GaussianSplatRasterize)
from .base import USIZE_MAX, Extent, Thunk

__all__ = [  # the public names, then every kind in the seed's declaration order
    "ALL_THUNKS", "USIZE_MAX", "Extent", "Thunk", "Nop", "ElementwiseRegion", "Sgemm", "SgemmHalf",
    "SgemmBf16", "SgemmF16", "SgemmT", "SgdMomentum", "CgemmC64", "DenseSolveF64", "DenseSolveF32",
    "CholeskyF32", "TriangularSolveF32", "DetF32", "SortF32", "SvdF32", "QrF32",
    "BatchedDenseSolveF64", "BatchedDenseSolveF32", "BatchedDgemmF64", "BatchedSgemm", "Dgemm",
    "TransposeF64", "ActivationF64", "ComplexNormSqF32", "ComplexNormSqBackwardF32", "ConjugateC64",
    "ActivationC64", "ReduceSumF64", "CopyF64", "CopyI64", "CastF32ToI64", "CastF32ToF64",
    "CastF64ToF32", "CastF64ToI64", "CastF64ToI32", "CastF64ToBool", "CastI64ToI32", "CastI64ToF64",
    "CastI32ToF64", "CastF32ToF16", "CastF16ToF32", "CastF32ToBf16", "CastBf16ToF32",
    "CastF32ToI32", "CastI64ToF32", "CastBoolToI32", "CastBoolToF32", "CastF32ToBool",
    "CastI32ToF32", "CastI32ToI64", "CastI32ToBool", "CastI64ToBool", "CastBoolToI64",
    "CastGeneric", "BinaryFullF64", "ConcatF64", "BinaryFullC64", "Scan", "ScanBackward",
    "ScanBackwardXs", "CustomFn", "FusedMmBiasAct", "FusedResidualLN", "FusedResidualRmsNorm",
    "BiasAdd", "BinaryFull", "ActivationInPlace", "Gather", "Narrow", "Reverse", "Copy",
    "RoundHalf", "LayerNorm", "GroupNorm", "BatchNormInference", "BatchNormInferenceBackwardInput",
    "BatchNormInferenceBackwardGamma", "BatchNormInferenceBackwardBeta", "LayerNorm2d",
    "ConvTranspose2d", "Conv3d", "ConvTranspose3d", "ResizeNearest2x", "Interpolate3d",
    "AxialRope2d", "RmsNorm", "AdaLayerNorm", "GatedResidual", "AdaLayerNormBackward",
    "GatedResidualBackward", "Softmax", "Cumsum", "CumScan", "SelectiveScan",
    "GatedDeltaNetBackward", "GatedDeltaNet", "Lstm", "Gru", "Rnn", "Mamba2", "Conv2D1x1",
    "DequantMatMul", "SynthMatMul", "SplineActivation", "DequantMatMulGguf", "DequantMatMulInt4",
    "DequantMatMulFp8", "DequantMatMulNvfp4", "DequantMatMulMxFp4x2", "DequantMatMulMlx",
    "ScaledMatMul", "ScaledGroupedMatMul", "ScaledQuantize", "ScaledQuantScale", "ScaledDequantize",
    "LoraMatMul", "Sample", "RngNormal", "RngUniform", "Attention", "AttentionBackward",
    "AttentionBackwardAll", "Rope", "FusedAttnBlock", "FusedBertLayer", "FusedNomicLayer",
    "FusedSwiGLU", "KvAppend", "Concat", "Compare", "Reduce", "Histogram", "ArgReduce", "TopK",
    "GroupedMatMul", "DequantGroupedMatMulGguf", "DequantGroupedMatMulMlx", "DequantMoEWeightsGguf",
    "ScatterAdd", "ScatterNd", "ScatterElements", "GatherNd", "GatherElements", "Where", "Fma",
    "Transpose", "GatherAxis", "Pool2D", "Pool3D", "Conv2D", "QMatMul", "QConv2d", "Quantize",
    "Dequantize", "FakeQuantize", "FakeQuantizeBackward", "FakeQuantizeLSQ",
    "FakeQuantizeLSQBackwardX", "FakeQuantizeLSQBackwardScale", "ReluBackward", "ReluBackwardF64",
    "ActivationBackward", "ActivationBackwardF64", "LayerNormBackwardInput",
    "LayerNormBackwardGamma", "RmsNormBackwardInput", "RmsNormBackwardGamma", "RmsNormBackwardBeta",
    "RopeBackward", "CumsumBackward", "GatherBackward", "GroupNormBackwardInput",
    "GroupNormBackwardGamma", "GroupNormBackwardBeta", "MaxPool2dBackward", "Conv2dBackwardInput",
    "Conv2dBackwardWeight", "MaxPool3dBackward", "Conv3dBackwardInput", "Conv3dBackwardWeight",
    "Im2Col", "SoftmaxCrossEntropyDense", "SoftmaxCrossEntropy", "SoftmaxCrossEntropyBackward",
    "CustomOp", "GaussianSplatRender", "GaussianSplatRenderBackward", "GaussianSplatPrepare",
    "GaussianSplatRasterize", "Fft1d", "Fft1dQ", "FftButterflyStage", "LogMel", "LogMelBackward",
    "WelchPeaks"]

ALL_THUNKS: dict[str, type[Thunk]] = {name: globals()[name] for name in __all__[4:]}
"""Every thunk kind name → its class, in the order the seed declares them (196 entries)."""
