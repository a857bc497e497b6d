"""Linear layers over a few rows, in the product layout the CPU's BLAS runs fastest.

A verify call feeds 2 to 64 tokens. On the CPU in float32, torch's `x @ W.T` over so few rows
runs a poorly blocked matrix product, while `(W @ x.T).T`, the same product in the other layout,
stays close to the cost of one row. Measured on Gemma-3-270M (two AVX2 cores, MKL, float32;
`benchmarks/bench_narrow_linear.py`, docs/results/narrow-linear/): its output head (262,144 x
640) over 2 rows takes 202 ms against 70 ms, over 16 rows 342 ms against 177 ms; with every
`nn.Linear` switched, a whole verify forward of 2 / 4 / 8 / 16 tokens costs 1.00 / 1.02 / 1.38 /
1.77 times one token instead of 1.69 / 2.16 / 2.16 / 2.50.

One row (plain decoding) and long inputs (prefill, training) keep torch's own kernel. The two
layouts differ by float rounding only, as two verify widths already do.
`POLYSPEC_NARROW_LINEAR=0` keeps torch's kernel everywhere.
"""

from __future__ import annotations

import os
import types

import torch
import torch.nn.functional as F

MAX_ROWS = 64  # measured faster up to here on every projection shape of the model above


def narrow_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`nn.Linear.forward` in the narrow layout for 2 to MAX_ROWS rows, torch's kernel otherwise."""
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    if not 2 <= rows <= MAX_ROWS or torch.is_grad_enabled():
        return F.linear(x, self.weight, self.bias)
    out = torch.mm(self.weight, x.reshape(rows, x.shape[-1]).t()).t()
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
