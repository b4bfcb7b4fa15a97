"""Linear: a projection that may fuse several checkpoint projections (q/k/v, gate/up) into one matmul.

Each fused part keeps its checkpoint name and width (`parts`), so the loader can fill it and a LoRA
delta can be applied per part. `delta` is the seam for per-token low-rank updates: when set, the
layer's output is `delta(x, linear)`, which computes the projection itself (with `base`, or folding
more rows into the same matmul, as the CUDA LoRA path does) and adds the updates. On CPU, `cpu_weight`
holds faster forms of the weight (runtime/native/models/cpu_weights.py) that `base` picks from. An FP8 Linear
(runtime/native/models/fp8.py) holds `weight` in float8_e4m3fn with its `weight_scale` (and maybe `input_scale`). An INT4
Linear (AWQ/GPTQ kept packed on CUDA, runtime/native/models/int4_checkpoint.py) has no `weight`: `qweight`, `qzeros`
and `qscales` in runtime/native/cuda/int4.py's layout.

Under tensor parallelism (runtime/native/parallel/) a Linear holds one rank's `shard` of the checkpoint's projection:
column-parallel, a slice of each part's output rows; row-parallel, a slice of the input columns, whose partial
outputs (LoRA deltas included) are summed across the ranks at the end of `forward`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from runtime.native.models.cpu_weights import CpuWeight
from runtime.native.models.fp8 import FP8, Fp8Rows, fp8_linear, scaled_mm_fits
from runtime.native.parallel.group import current

Delta = Callable[[torch.Tensor, "Linear"], torch.Tensor]


@dataclass(frozen=True)
class Shard:
    """This rank's slice of a checkpoint projection. Column-parallel: `rows`, (start, count) of each part's output
    rows out of its `full_rows` (a count short of the part's size here leaves zero rows: a vocabulary's padding).
    Row-parallel: `cols`, (start, count) of the input columns out of `full_cols`; the bias is added on the first rank
    only."""

    rows: tuple[tuple[int, int], ...] = ()
    full_rows: tuple[int, ...] = ()
    cols: tuple[int, int] | None = None
    full_cols: int = 0

    def take(self, linear: Linear, attr: str, tensor: torch.Tensor, part: str | None) -> torch.Tensor:
        """The rank's slice of the checkpoint tensor for `attr` (and part) of `linear`. `tensor` may be a lazy view
        of the checkpoint's tensor (loader.py's LazyTensor: a weight's `narrow` reads only that slice)."""
        if self.cols is not None:
            if attr == "bias":
                return tensor if current().rank == 0 else torch.zeros_like(tensor)
            return tensor.narrow(1, *self.cols)
        if part is not None:
            index = linear.part_names.index(part)
            return _rows(tensor, 0, self.rows[index], linear.part_sizes[index])
        # a checkpoint that fuses the parts too (Phi-3's qkv_proj): each part's slice at its offset in the whole
        offsets = [sum(self.full_rows[:i]) for i in range(len(self.full_rows))]
        return torch.cat([_rows(tensor, offset, rows, size)
                          for offset, rows, size in zip(offsets, self.rows, linear.part_sizes)])


def _rows(tensor: torch.Tensor, offset: int, rows: tuple[int, int], size: int) -> torch.Tensor:
    """Rows offset + rows[0] .. of `tensor`, `rows[1]` of them, zero-padded to `size`."""
    piece = tensor.narrow(0, offset + rows[0], rows[1])
    if rows[1] == size:
        return piece
    return torch.cat((piece, piece.new_zeros(size - rows[1], *piece.shape[1:])))


class Linear(nn.Module):
    """y = x W^T + b over packed tokens; `parts` names the output slices when checkpoints store them apart."""

    def __init__(
        self,
        in_features: int,
        parts: Sequence[tuple[str, int]],
        *,
        bias: bool = False,
        dtype: torch.dtype = torch.float32,
        shard: Shard | None = None,
    ) -> None:
        super().__init__()
        self.shard = shard  # None: the whole projection (in_features and parts are this rank's sizes otherwise)
        self.in_features = in_features
        self.part_names: tuple[str, ...] = tuple(name for name, _ in parts)
        self.part_sizes: tuple[int, ...] = tuple(size for _, size in parts)
        self.out_features = sum(self.part_sizes)
        # empty, not initialised: every value is overwritten by the checkpoint
        self.weight = nn.Parameter(torch.empty(self.out_features, in_features, dtype=dtype), requires_grad=False)
        self.bias = (
            nn.Parameter(torch.empty(self.out_features, dtype=dtype), requires_grad=False) if bias else None
        )
        # FP8 weights (runtime/native/models/fp8_checkpoint.py makes them parameters): float32 [out] and [1]
        self.register_parameter("weight_scale", None)
        self.register_parameter("input_scale", None)
        # INT4 weights (int4_checkpoint.py's to_int4_form): int32 [out, in/8], uint8 [out, groups], [out, groups] as
        # loaded, then in the kernels' tile-major layout (runtime/native/cuda/int4.py)
        self.register_parameter("qweight", None)
        self.register_parameter("qzeros", None)
        self.register_parameter("qscales", None)
        # an INT4 checkpoint's grid on CPU (int4_checkpoint.py): scale and offset per 32 inputs, so that
        # --cpu-quantization int4 keeps the stored 4-bit values; dropped once the CPU forms are made
        self.int4_grid: tuple[torch.Tensor, torch.Tensor] | None = None
        self.delta: Delta | None = None
        self.cpu_weight: CpuWeight | None = None  # prepacked and quantized forms on CPU (prepare_cpu_weights)

    def forward(self, x: torch.Tensor | Fp8Rows) -> torch.Tensor:
        if isinstance(x, Fp8Rows):  # quantized by the kernel before, which asked `takes_fp8_rows`
            y = fp8_linear(x, self.weight, self.weight_scale, None, self.bias)
        else:
            y = self.delta(x, self) if self.delta is not None else self.base(x)
        if self.shard is not None and self.shard.cols is not None:  # row-parallel: every rank's partial sums
            return current().all_reduce(y)
        return y

    def base(self, x: torch.Tensor) -> torch.Tensor:
        """The projection without adapters."""
        if self.cpu_weight is not None:
            return self.cpu_weight.linear(x, self.weight, self.bias)
        if self.qweight is not None:
            from runtime.native.cuda.int4 import int4_linear  # Triton: imported only where INT4 weights are kept

            rows = x.reshape(-1, self.in_features).contiguous()
            y = int4_linear(rows, self.qweight, self.qzeros, self.qscales, self.out_features, self.bias)
            return y.reshape(*x.shape[:-1], self.out_features)
        if self.weight.dtype == FP8:
            return fp8_linear(x, self.weight, self.weight_scale, self.input_scale, self.bias)
        return F.linear(x, self.weight, self.bias)

    @property
    def takes_fp8_rows(self) -> bool:
        """Can `forward` take its input quantized already (Fp8Rows, by runtime/native/cuda/fused.py's kernels)? FP8
        weights with dynamic per-token activation scales, in a shape `_scaled_mm` takes, without a LoRA delta (which
        reads the 16-bit rows) or CPU forms."""
        return (self.weight is not None and self.weight.dtype == FP8 and self.input_scale is None
                and self.delta is None and self.cpu_weight is None and scaled_mm_fits(self.weight))

    def part_range(self, part: str) -> tuple[int, int]:
        """(start, size) of a named part along the output dimension."""
        index = self.part_names.index(part)
        return sum(self.part_sizes[:index]), self.part_sizes[index]

    @property
    def full_in_features(self) -> int:
        """The checkpoint projection's input width (this Linear's unless row-parallel)."""
        return self.shard.full_cols if self.shard is not None and self.shard.cols is not None else self.in_features

    def full_part_range(self, part: str | None) -> tuple[int, int]:
        """(start, size) of a named part (None: every part) along the checkpoint projection's output dimension."""
        sizes = self.shard.full_rows if self.shard is not None and self.shard.cols is None else self.part_sizes
        if part is None:
            return 0, sum(sizes)
        index = self.part_names.index(part)
        return sum(sizes[:index]), sizes[index]

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The output cut into its parts, in order."""
        return y.split(self.part_sizes, dim=-1)

    def load(self, attr: str, tensor: torch.Tensor, part: str | None) -> None:
        """Copy a checkpoint tensor into `weight`/`bias`, or into one part's rows of it."""
        param: torch.Tensor = getattr(self, attr)
        if self.shard is not None:
            tensor = self.shard.take(self, attr, tensor, part)
        target = param.data
        if part is not None:
            start, size = self.part_range(part)
            target = target.narrow(0, start, size)
        if target.shape != tensor.shape:
            raise ValueError(f"shape mismatch for {attr}[{part}]: checkpoint {tuple(tensor.shape)}, "
                             f"model {tuple(target.shape)}")
        target.copy_(tensor)
