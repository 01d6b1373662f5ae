"""Named model configurations: the paper's rows (param-matched to ~5.9M) and tiny ones for tests.

| name         | blocks 3-7          | n_s | TIM FFN inner (sum over mechanisms) |
|--------------|---------------------|-----|-------------------------------------|
| transformer  | standard            | -   | -   (standard FFN inner 256)      |
| tim-nocomp   | TIM, c = 1          | 2   | 768                                 |
| tim          | TIM                 | 2   | 768                                 |
| tim4         | TIM                 | 4   | 2048                                |

The TIM FFN widths are chosen so that every row has the baseline's parameter count (within 0.5%); the authors'
code used 512, which gives 5.58M for n_s=2 (see README).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from models.attention import AttentionConfig
from models.encoder_layer import StandardLayerConfig
from models.enhancer import EnhancerConfig
from models.mae import MAEConfig
from models.pre_encoder import PreEncoderConfig
from models.sdu import SDUConfig
from models.tim_layer import TIMLayerConfig

PAPER_TIM_BLOCKS = (3, 4, 5, 6, 7)


def paper_config(
    n_mechanisms: int = 1,
    competition: bool = True,
    tim_d_ff: int = 768,
    context_frames: int = 250,
    output: str = "residual",
) -> EnhancerConfig:
    """The paper's 8-block encoder; ``n_mechanisms == 1`` is the Transformer baseline."""
    standard = StandardLayerConfig(attention=AttentionConfig(context_frames=context_frames), d_ff=256)
    if n_mechanisms == 1:
        return EnhancerConfig(standard=standard, output=output)
    tim = TIMLayerConfig(
        attention=AttentionConfig(n_groups=n_mechanisms, context_frames=context_frames),
        competition=competition,
        d_ff=tim_d_ff,
    )
    return EnhancerConfig(standard=standard, tim=tim, tim_blocks=PAPER_TIM_BLOCKS, output=output)


def with_sdu(
    cfg: EnhancerConfig, sdu: SDUConfig | None = None, blocks: tuple[int, ...] = (1, 2)
) -> EnhancerConfig:
    """``cfg`` with self-dependency units on ``blocks`` (default: the two bottom blocks, attention and FFN)."""
    return dataclasses.replace(cfg, sdu=sdu or SDUConfig(), sdu_blocks=blocks)


def with_mae(
    cfg: EnhancerConfig, mae: MAEConfig | None = None, blocks: tuple[int, ...] | None = None
) -> EnhancerConfig:
    """``cfg`` with a mixture of attentive experts in the attention of ``blocks`` (default: every block, as the MAE
    paper replaces every multi-head attention)."""
    blocks = tuple(range(1, cfg.n_layers + 1)) if blocks is None else blocks
    return dataclasses.replace(cfg, mae=mae or MAEConfig(), mae_blocks=blocks)


def tiny_config(n_mechanisms: int = 2, competition: bool = True, context_frames: int = 4) -> EnhancerConfig:
    """A ~38k-parameter model with the same structure (3 blocks, block 2 TIM) for fast tests."""
    attn = AttentionConfig(d_model=16, n_heads=4, context_frames=context_frames)
    standard = StandardLayerConfig(attention=attn, d_ff=32)
    pre = PreEncoderConfig(channels=(32, 16, 16, 16))
    if n_mechanisms == 1:
        return EnhancerConfig(pre_encoder=pre, standard=standard, n_layers=3, output="residual")
    tim = TIMLayerConfig(
        attention=AttentionConfig(
            d_model=16, n_heads=4, n_groups=n_mechanisms, context_frames=context_frames
        ),
        competition=competition,
        d_ff=32,
        inter_heads=2,
        inter_head_dim=4,
    )
    return EnhancerConfig(
        pre_encoder=pre, standard=standard, tim=tim, n_layers=3, tim_blocks=(2,), output="residual"
    )


REGISTRY: dict[str, Callable[[], EnhancerConfig]] = {
    "transformer": lambda: paper_config(1),
    "tim-nocomp": lambda: paper_config(2, competition=False, tim_d_ff=768),
    "tim": lambda: paper_config(2, tim_d_ff=768),
    "tim4": lambda: paper_config(4, tim_d_ff=2048),
    "tim-direct": lambda: paper_config(2, tim_d_ff=768, output="direct"),
    # Highway Transformer's self-dependency units on the bottom blocks (where that paper found them best)
    "transformer+sdu": lambda: with_sdu(paper_config(1)),
    "tim+sdu": lambda: with_sdu(paper_config(2, tim_d_ff=768)),
    "tim+highway": lambda: with_sdu(paper_config(2, tim_d_ff=768), SDUConfig(highway=True)),
    # a mixture of attentive experts (MAE) in every block's attention; per-mechanism gates in TIM blocks
    "transformer+mae": lambda: with_mae(paper_config(1)),
    "tim+mae": lambda: with_mae(paper_config(2, tim_d_ff=768)),
    "tiny": lambda: tiny_config(2),
    "tiny-transformer": lambda: tiny_config(1),
    "tiny-nocomp": lambda: tiny_config(2, competition=False),
    "tiny-tim4": lambda: tiny_config(4),
    "tiny+sdu": lambda: with_sdu(
        tiny_config(2), SDUConfig(psi="tanh")
    ),  # block 2 is TIM: per-mechanism gates
    "tiny+highway": lambda: with_sdu(tiny_config(2), SDUConfig(highway=True, attention=False)),
    "tiny+mae": lambda: with_mae(tiny_config(2), MAEConfig(hidden=8)),  # block 2 is TIM: a gate per mechanism
    "tiny-transformer+mae": lambda: with_mae(tiny_config(1), MAEConfig(hidden=8)),
}

PAPER_CONFIGS = ("transformer", "tim-nocomp", "tim", "tim4")
SDU_CONFIGS = ("transformer+sdu", "tim+sdu", "tim+highway")
MAE_CONFIGS = ("transformer+mae", "tim+mae")


def get_config(name: str) -> EnhancerConfig:
    try:
        return REGISTRY[name]()
    except KeyError:
        raise KeyError(f"unknown model config '{name}'; known: {', '.join(REGISTRY)}") from None
