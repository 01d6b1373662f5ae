"""8-bit weights for the pre-encoder's products in PyTorch: what the ``torchscript-int8`` backend traces.

The pre-encoder's four convolutions are the largest weight matrices of the default model (771 x 1024,
3072 x 512, 1536 x 128, 384 x 256: 10.1 of its 22.5 MiB), and a per-hop stream reads every weight each 16 ms.
:func:`int8_pre_encoder` returns a copy of the model whose conv blocks multiply by int8 copies of those weights
(one float scale per output channel; PyTorch's dynamic int8 product, ``torch.ops.quantized.linear_dynamic``,
which quantises each call's input to 8 bits per tensor as it runs, with 7-bit inputs: ``reduce_range``, against
the 16-bit saturation of CPUs without VNNI). Everything else stays float32. The int8 products are the blocks'
windowed products (:meth:`Int8ConvBlock.frames`), which the fixed-shape step uses; the copy's whole-utterance
convolutions stay float (only the backend's traced step runs the copy).

Smaller products are left in float32 on purpose: at one frame per call PyTorch's int8 product costs more than a
float32 one at 256 x 768 and below (session 30, ``bench/README.md``, "int8 pre-encoder in PyTorch"), and the
transformer's products are that size or smaller. Not the float samples: 42.9 dB from them on the default model
(median over the 120 dev pairs; scores equal; ``bench/bench_int8.py --backend torchscript-int8``).
"""

from __future__ import annotations

import copy
import warnings

import torch

from models.enhancer import Enhancer
from models.pre_encoder import ConvBlock


class Int8Unavailable(RuntimeError):
    """This PyTorch build has no int8 product for this CPU (its quantized engine, or the op itself, is missing)."""


class Int8ConvBlock(ConvBlock):
    """A :class:`ConvBlock` whose windowed product (:meth:`frames`) multiplies by int8 weights, per output
    channel. Built from a float block (:meth:`from_float`), whose conv, norm and activation it keeps."""

    packed: torch.Tensor  # PyTorch's packed int8 weights and float bias (an opaque script object)

    @classmethod
    def from_float(cls, block: ConvBlock) -> Int8ConvBlock:
        conv = block.conv
        new = cls(
            conv.in_channels, conv.out_channels, conv.kernel_size[0], block.pad, block.act.negative_slope
        )
        new.load_state_dict(block.state_dict())
        weight = conv.weight.detach().float().flatten(1)  # [C_out, C_in * k], the order of windows()
        bias = None if conv.bias is None else conv.bias.detach().float()
        scale = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
        with warnings.catch_warnings():  # PyTorch 2.13 marks its quantized tensors deprecated (for torchao)
            warnings.simplefilter("ignore")
            try:
                q = torch.quantize_per_channel(
                    weight, scale, torch.zeros(len(scale), dtype=torch.long), 0, torch.qint8
                )
                new.packed = torch.ops.quantized.linear_prepack(q, bias)
            except (RuntimeError, AttributeError) as exc:
                raise Int8Unavailable(
                    f"this PyTorch build cannot run int8 products here ({str(exc).splitlines()[0]}); "
                    "use the torchscript backend"
                ) from None
        return new.float().eval()

    def frames(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`ConvBlock.frames` with the int8 product (7-bit inputs: ``reduce_range``)."""
        product = torch.ops.quantized.linear_dynamic(self.windows(x).contiguous(), self.packed, True)
        return self.act(self.norm(product))


def int8_pre_encoder(model: Enhancer) -> Enhancer:
    """A float32 eval-mode copy of ``model`` with every pre-encoder conv block an :class:`Int8ConvBlock` (the
    caller's model is left as it was). Raises :class:`Int8Unavailable` where PyTorch has no int8 product."""
    new = copy.deepcopy(model).float().eval()
    blocks = new.pre_encoder.blocks
    for i, block in enumerate(blocks):
        assert isinstance(block, ConvBlock)
        blocks[i] = Int8ConvBlock.from_float(block)
    return new
