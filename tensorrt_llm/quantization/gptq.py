"""GPTQ (Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers", 2022): error-compensating rounding of a linear's weight onto any of our formats'
grids, written from the paper's algorithm.

A linear y = x W^T with calibration inputs X [n, K] is quantized to minimise the layer's output
error ||X W^T - X Q^T||^2, whose Hessian in each weight row is H = 2 X^T X / n (the same for
every row). Columns (inputs) are quantized in order, k = 0 .. K-1: column k is rounded to the
grid, and its rounding error, scaled by the Cholesky factor of H^-1, is spread over the columns
not yet quantized, which absorb it (the optimal brain surgeon update, with H^-1 restricted to
the remaining columns read off the upper Cholesky factor U of H^-1, H^-1 = U^T U). Updates are
applied lazily in blocks of `block_size` columns. H is damped by `damp` x mean(diag H) on its
diagonal; inputs that never fire (diag 0) are dropped from the weight (their column is zero
in the result, as they contribute nothing to X W^T).

The grid is elementwise, given per column by a `Grid` (`fp8_grid`, `int8_grid`, `int4_grid`
below): FP8 E4M3 with the layer's per-tensor or per-channel scale; INT8 per channel or per
group; INT4 asymmetric per group. Per-tensor and per-channel scales are fixed from the float
weight before GPTQ starts (so the scale is the round-to-nearest quantizer's, and an updated
weight beyond it is clamped); group scales (and INT4 zeros) are fitted, as the paper does, to a
group's updated weights when the walk reaches its first column. With H = I (no correlation
between inputs) nothing is propagated and GPTQ is round-to-nearest.

`gptq(w, h, grid)` is the pure algorithm (float32 [N, K] -> the quantized weight, dequantized);
`quantize_gptq(w, h, layer, ...)` returns the format's weight (formats.py) for a layer's
`LayerQuant`. `HessianAccumulator` sums 2 x^T x over calibration batches.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .formats import (
    Fp8Weight,
    Int4Weight,
    Int8Weight,
    QuantizedWeight,
    _groups,
    _safe,
    fp8_codes,
    fp8_weight_scale,
    int4_codes,
    int4_scale_zero,
    int8_codes,
    int8_scale,
    pack_int4,
)
from .mode import INT4_GROUP_SIZES, INT8_GROUP_SIZES, LayerQuant, QuantAlgo

DEFAULT_DAMP = 0.01
DEFAULT_BLOCK = 128


class HessianAccumulator:
    """H = 2 X^T X / n over every row x (the last dimension is K) of the batches added (summed
    in float32: H is damped and only steers the rounding), on the inputs' device (a GPU's
    calibration does the products there); `hessian()` is on the CPU."""

    def __init__(self, in_features: int):
        self.h = None
        self.in_features = in_features
        self.rows = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).float()
        if x.shape[1] != self.in_features:
            raise ValueError(f"HessianAccumulator: inputs of width {x.shape[1]}, expected {self.in_features}")
        if self.h is None:
            self.h = torch.zeros(self.in_features, self.in_features, dtype=torch.float32, device=x.device)
        self.h += 2 * (x.t() @ x.to(self.h.device))
        self.rows += x.shape[0]

    def hessian(self) -> torch.Tensor:
        if not self.rows:
            raise ValueError("HessianAccumulator: no inputs were added")
        return (self.h / self.rows).cpu()


@dataclass
class Grid:
    """An elementwise quantizer along the columns of an [N, K] weight. `fit(w_group, start)` is
    called with the (updated) columns start .. start + group_size - 1 when the walk reaches a
    group's first column (group_size None: never; the parameters are fixed up front);
    `round(col, k)` returns column k ([N]) rounded to the grid, dequantized (float32)."""
    group_size: int | None
    round: Callable[[torch.Tensor, int], torch.Tensor]
    fit: Callable[[torch.Tensor, int], None] = lambda w, start: None
    params: dict = field(default_factory=dict)


def fp8_grid(scale: torch.Tensor) -> Grid:
    """FP8 E4M3 with a fixed float32 scale, [1] (per tensor) or [N] (per output channel)."""
    scale = scale.float().reshape(-1)
    s = _safe(scale)

    def rnd(col, k):
        return fp8_codes(col, scale).float() * s
    return Grid(None, rnd, params={"scale": scale})


def int8_grid(w: torch.Tensor, group_size: int | None = None) -> Grid:
    """Symmetric INT8, -127..127: per output channel (scale amax / 127 of the float row, fixed)
    or per group (amax / 127 of the group's updated weights)."""
    n, k = w.shape
    if group_size is None:
        scales = int8_scale(w.abs().amax(dim=1))
    else:
        _groups(w, group_size, INT8_GROUP_SIZES)
        scales = torch.zeros(n, k // group_size)
    g = Grid(group_size, None, params={"scales": scales})

    def fit(block, start):
        scales[:, start // group_size] = int8_scale(block.abs().amax(dim=1))

    def rnd(col, j):
        s = scales if group_size is None else scales[:, j // group_size]
        return int8_codes(col, s) * _safe(s)
    g.round = rnd
    if group_size is not None:
        g.fit = fit
    return g


def int4_grid(w: torch.Tensor, group_size: int, scale_dtype: torch.dtype = torch.float16) -> Grid:
    """Asymmetric INT4 per group (formats.quantize_int4's grid: zero = min, scale = (max - min) /
    15, both rounded to `scale_dtype`), fitted to each group's updated weights."""
    n, k = w.shape
    _groups(w, group_size, INT4_GROUP_SIZES)
    scales = torch.zeros(n, k // group_size, dtype=scale_dtype)
    zeros = torch.zeros(n, k // group_size, dtype=scale_dtype)

    def fit(block, start):
        scales[:, start // group_size], zeros[:, start // group_size] = int4_scale_zero(
            block.amin(dim=1), block.amax(dim=1), scale_dtype)

    def rnd(col, j):
        s, z = scales[:, j // group_size].float(), zeros[:, j // group_size].float()
        return int4_codes(col, s, z) * s + z
    return Grid(group_size, rnd, fit, {"scales": scales, "zeros": zeros})


def _inverse_cholesky(h: torch.Tensor, damp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(U, dead): the upper Cholesky factor of (H + damp * mean(diag H) I)^-1, dead inputs'
    diagonal set to 1 first; `dead` the mask of inputs with H[k, k] == 0."""
    h = h.double().clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    h += damp * torch.mean(torch.diag(h)) * torch.eye(h.shape[0], dtype=h.dtype)
    try:
        lower = torch.linalg.cholesky(h)
        hinv = torch.cholesky_inverse(lower)
        return torch.linalg.cholesky(hinv, upper=True), dead
    except torch.linalg.LinAlgError:
        raise ValueError("GPTQ: the damped Hessian is not positive definite; give a larger damp") from None


def gptq(w: torch.Tensor, h: torch.Tensor, grid: Grid, damp: float = DEFAULT_DAMP,
         block_size: int = DEFAULT_BLOCK) -> torch.Tensor:
    """The paper's algorithm: float [N, K] weight `w`, [K, K] Hessian `h` (2 X^T X / n), `grid`
    -> float32 [N, K] weight on the grid, every column rounded by `grid.round` after the
    errors of the columns before it were propagated into it."""
    if w.dim() != 2 or h.shape != (w.shape[1], w.shape[1]):
        raise ValueError(f"GPTQ: a [N, K] weight and a [K, K] Hessian, got {tuple(w.shape)} and {tuple(h.shape)}")
    if not torch.isfinite(h).all():
        raise ValueError("GPTQ: the Hessian has non-finite values")
    if damp < 0:
        raise ValueError(f"GPTQ: damp must be >= 0, got {damp}")
    if grid.group_size is not None and block_size % grid.group_size:
        block_size = grid.group_size * max(1, block_size // grid.group_size)
    w = w.float().clone()
    n, k = w.shape
    u, dead = _inverse_cholesky(h, damp)
    w[:, dead] = 0
    u = u.float()
    q = torch.zeros_like(w)
    for b0 in range(0, k, block_size):
        b1 = min(b0 + block_size, k)
        wb = w[:, b0:b1].clone()
        err = torch.zeros_like(wb)
        ub = u[b0:b1, b0:b1]
        for j in range(b1 - b0):
            col = b0 + j
            if grid.group_size is not None and col % grid.group_size == 0:
                grid.fit(wb[:, j:j + grid.group_size], col)
            qc = grid.round(wb[:, j], col)
            q[:, col] = qc
            e = (wb[:, j] - qc) / ub[j, j]
            wb[:, j:] -= e[:, None] * ub[j, j:][None, :]
            err[:, j] = e
        w[:, b1:] -= err @ u[b0:b1, b1:]
    return q


def gptq_act_order(w: torch.Tensor, h: torch.Tensor, grid: Grid, damp: float = DEFAULT_DAMP,
                   block_size: int = DEFAULT_BLOCK) -> torch.Tensor:
    """gptq() walking the inputs in order of decreasing H[k, k] (act-order: the most active
    inputs first, while the most columns remain to absorb their error), with "static groups":
    group scales / zeros fitted up front to the float weight's groups in the layer's own input
    order (round-to-nearest's), so the result stays in that order on that grid and needs no
    input permutation in the format. Returns the weight in the layer's input order."""
    k = w.shape[1]
    w = w.float()
    if grid.group_size is not None:
        for start in range(0, k, grid.group_size):
            grid.fit(w[:, start:start + grid.group_size], start)
    perm = torch.sort(torch.diag(h), descending=True, stable=True).indices
    order = perm.tolist()
    walk = Grid(None, lambda col, j: grid.round(col, order[j]))
    q_perm = gptq(w[:, perm], h[perm][:, perm], walk, damp, block_size)
    q = torch.empty_like(q_perm)
    q[:, perm] = q_perm
    return q


def rtn(w: torch.Tensor, grid: Grid) -> torch.Tensor:
    """Round-to-nearest on the same grid (groups fitted to the float weights): GPTQ's baseline."""
    w = w.float()
    out = torch.empty_like(w)
    for col in range(w.shape[1]):
        if grid.group_size is not None and col % grid.group_size == 0:
            grid.fit(w[:, col:col + grid.group_size], col)
        out[:, col] = grid.round(w[:, col], col)
    return out


def quantize_gptq(w: torch.Tensor, h: torch.Tensor, layer: LayerQuant, *, per_channel: bool = False,
                  fp8_amax: torch.Tensor | None = None, input_scale: torch.Tensor | None = None,
                  damp: float = DEFAULT_DAMP, block_size: int = DEFAULT_BLOCK,
                  act_order: bool = False) -> QuantizedWeight:
    """Linear weight `w` [N, K] quantized by GPTQ with Hessian `h` into `layer`'s format
    (weight_format int8 / int4 / fp8), scales as formats.py's round-to-nearest quantizers
    choose them: FP8 amax / 448 per tensor (`fp8_amax`, a shared larger amax, as
    quantize_fp8's `amax`) or per channel (`per_channel`), with `input_scale` the static
    activation scale or None. `act_order`: see gptq_act_order."""
    w = w.float()
    fmt = layer.weight_format

    def run(grid):
        return (gptq_act_order if act_order else gptq)(w, h, grid, damp, block_size)
    if fmt == "fp8":
        scale = fp8_weight_scale(w, per_channel, None if per_channel else fp8_amax)
        codes = fp8_codes(run(fp8_grid(scale)), scale[:, None] if per_channel else scale)
        if input_scale is not None:
            input_scale = torch.as_tensor(input_scale, dtype=torch.float32).reshape(1)
        return Fp8Weight(codes, scale, input_scale)
    if fmt == "int8":
        grid = int8_grid(w, layer.group_size)
        q = run(grid)
        s = grid.params["scales"]
        per_input = s[:, None] if layer.group_size is None else s.repeat_interleave(layer.group_size, 1)
        return Int8Weight(int8_codes(q, per_input).to(torch.int8), s.float(), layer.group_size)
    if fmt == "int4":
        grid = int4_grid(w, layer.group_size)
        q = run(grid)
        s, z = (grid.params[key].float().repeat_interleave(layer.group_size, 1) for key in ("scales", "zeros"))
        codes = int4_codes(q, s, z).to(torch.uint8)
        return Int4Weight(pack_int4(codes), grid.params["scales"], grid.params["zeros"], layer.group_size)
    raise ValueError(f"GPTQ: no grid for weight format {fmt!r}")


def layer_error(x: torch.Tensor, w: torch.Tensor, q: torch.Tensor) -> float:
    """||x W^T - x Q^T||^2 / ||x W^T||^2: the layer output's relative squared error."""
    ref = x.float() @ w.float().t()
    return float(((ref - x.float() @ q.float().t()) ** 2).sum() / (ref ** 2).sum())


__all__ = ["HessianAccumulator", "Grid", "fp8_grid", "int8_grid", "int4_grid", "gptq", "gptq_act_order", "rtn",
           "quantize_gptq", "layer_error", "DEFAULT_DAMP", "QuantAlgo"]
