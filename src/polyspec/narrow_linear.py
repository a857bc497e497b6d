"""Linear layers over a few rows, in the product layout the CPU's BLAS runs fastest.

A verify call feeds 2 to 64 tokens. On the CPU in float32, torch's `x @ W.T` over so few rows
runs a poorly blocked matrix product, while `(W @ x.T).T`, the same product in the other layout,
stays close to the cost of one row. Measured on Gemma-3-270M (two AVX2 cores, MKL, float32;
`benchmarks/bench_narrow_linear.py`, docs/results/narrow-linear/): its output head (262,144 x
640) over 2 rows takes 122 ms against 46 ms, over 16 rows 182 ms against 125 ms; with every
`nn.Linear` switched, a whole verify forward of 2 / 4 / 8 / 16 tokens costs 1.21 / 1.30 / 1.82 /
2.25 times one token instead of 1.96 / 2.29 / 2.43 / 3.05.

One row (plain decoding) through a large weight (the output head) goes as two, the row twice:
MKL runs a matrix-vector product of that size on one core, so the head over one row takes
55 ms against 46 ms for the two (same benchmark). One row through a small weight, and long
inputs (prefill, training), keep torch's own kernel. The layouts differ by float rounding
only, as two verify widths already do.
`POLYSPEC_NARROW_LINEAR=0` keeps torch's kernel everywhere.
"""

from __future__ import annotations

import os
import types

import torch
import torch.nn.functional as F

MAX_ROWS = 64  # measured faster up to here on every projection shape of the model above
# One row goes as two through weights this large; below it (the model's projections, up to
# 2048 x 640) the two ways cost about the same, a fraction of a millisecond.
PAIR_MIN_WEIGHT = 1 << 24


def narrow_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`nn.Linear.forward` in the narrow layout for 2 to MAX_ROWS rows (and one row through a
    large weight, as two), torch's kernel otherwise."""
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    paired = rows == 1 and self.weight.numel() >= PAIR_MIN_WEIGHT
    if not (2 <= rows <= MAX_ROWS or paired) or torch.is_grad_enabled():
        return F.linear(x, self.weight, self.bias)
    flat = x.reshape(rows, x.shape[-1])
    if paired:
        flat = flat.repeat(2, 1)
    out = torch.mm(self.weight, flat.t()).t()[:rows]
    if self.bias is not None:
        out = out + self.bias
    return out.reshape(*x.shape[:-1], self.weight.shape[0])


def use_narrow_layout(model: torch.nn.Module) -> int:
    """Switches a model's plain `nn.Linear` layers with float32 weights on the CPU to the narrow
    layout (other layers, and subclasses such as quantized ones, keep their own); returns how
    many were switched."""
    if os.environ.get("POLYSPEC_NARROW_LINEAR", "1") == "0":
        return 0
    switched = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if type(module) is torch.nn.Linear and weight.device.type == "cpu" and weight.dtype == torch.float32:
            module.forward = types.MethodType(narrow_forward, module)
            switched += 1
    model.narrow_linear_layers = switched
    return switched


def layout(model: torch.nn.Module) -> str:
    """How the model computes its linear layers (what a timing of it depends on)."""
    return "narrow" if getattr(model, "narrow_linear_layers", 0) else "torch"
