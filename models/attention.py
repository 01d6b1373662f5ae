"""Banded causal multi-head self-attention over frames.

Query frame ``t`` attends to key frames ``t - context_frames ... t`` (the current frame and at most
``context_frames`` past ones): strictly causal, and bounded so that streaming needs bounded memory and long files
stay linear in time. With ``n_groups > 1`` the Q/K/V/O projections are per-mechanism :class:`GroupLinear` maps and
the heads are divided evenly among mechanisms, so each mechanism attends only within its own slice (TIM's
position attention); ``n_groups == 1`` is ordinary multi-head attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from models.group_linear import GroupLinear, fused_group_linear
from models.mae import MAEConfig, MAEGate, windowed_mean


@dataclass(frozen=True)
class AttentionConfig:
    d_model: int = 256
    n_heads: int = 16
    n_groups: int = 1  # mechanisms; heads are split evenly among them
    context_frames: int = 250  # past frames each query may see (250 x 16 ms = 4 s)
    # dropout on attention probabilities. Off by default: on CPU it forces SDPA's slow math path and cost 30% of a
    # training step (measured, see README); the layers keep dropout 0.1 on residual branches and FFNs.
    attn_dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.d_model % self.n_groups or self.n_heads % self.n_groups:
            raise ValueError(
                f"d_model {self.d_model} and n_heads {self.n_heads} must divide by n_groups {self.n_groups}"
            )
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} must divide by n_heads {self.n_heads}")
        if self.context_frames < 0:
            raise ValueError("context_frames must be >= 0")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def banded_causal_mask(
    n_queries: int,
    n_keys: int,
    context_frames: int,
    query_offset: int = 0,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Boolean ``[n_queries, n_keys]``, True where query ``query_offset + i`` may attend key ``j``."""
    q = torch.arange(n_queries, device=device).unsqueeze(1) + query_offset
    k = torch.arange(n_keys, device=device).unsqueeze(0)
    lag = q - k
    return (lag >= 0) & (lag <= context_frames)


def banded_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context_frames: int, dropout_p: float = 0.0
) -> torch.Tensor:
    """Scaled dot-product attention of ``[B, H, T, Dh]`` tensors under the banded causal mask.

    Long sequences are processed in query blocks of ``max(context_frames, 64)`` frames, each against only the keys
    it can see, so memory and time grow linearly with T instead of quadratically.
    """
    n = q.shape[-2]
    block = max(context_frames, 64)
    if n <= 2 * block:
        mask = banded_causal_mask(n, n, context_frames, device=q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    outs = []
    for start in range(0, n, block):
        stop = min(start + block, n)
        k0 = max(0, start - context_frames)
        mask = banded_causal_mask(stop - start, stop - k0, context_frames, start - k0, device=q.device)
        outs.append(
            F.scaled_dot_product_attention(
                q[..., start:stop, :],
                k[..., k0:stop, :],
                v[..., k0:stop, :],
                attn_mask=mask,
                dropout_p=dropout_p,
            )
        )
    return torch.cat(outs, dim=-2)


class KVCache:
    """Keys and values of the last ``context_frames`` frames one attention layer has seen (and, for MAE layers,
    the gate's input ``u`` of the same frames).

    ``k``/``v`` are views ``[B, H, n, Dh]`` (``u``: ``[B, G, n, d/G]``; n <= context_frames) of buffers with room to
    append: appending costs the new frames only (the buffers are compacted once every ~``context_frames``
    frames), instead of re-copying the whole context every step. Streaming state, bounded however long the stream.
    """

    def __init__(self, k: torch.Tensor, v: torch.Tensor, u: torch.Tensor | None = None) -> None:
        self._bufs = [k, v] if u is None else [k, v, u]  # [B, H or G, capacity, D]
        self.start = self.end = 0

    @property
    def k(self) -> torch.Tensor:
        return self._bufs[0][:, :, self.start : self.end]

    @property
    def v(self) -> torch.Tensor:
        return self._bufs[1][:, :, self.start : self.end]

    @property
    def u(self) -> torch.Tensor | None:
        return self._bufs[2][:, :, self.start : self.end] if len(self._bufs) > 2 else None

    def extend(self, *new: torch.Tensor, keep: int) -> list[torch.Tensor]:
        """Append new frames (k, v and, for MAE layers, u); return views of cached + new frames of each (for this
        step's attention), then forget all but the last ``keep`` frames."""
        if len(new) != len(self._bufs):
            raise ValueError(f"this cache holds {len(self._bufs)} tensors, got {len(new)}")
        n, size = new[0].shape[2], self.end - self.start
        if self.end + n > self._bufs[0].shape[2]:
            capacity = max(2 * (size + n), 2 * keep + 2 * n)
            grown = []
            for buf in self._bufs:
                fresh = (
                    buf.new_empty((*buf.shape[:2], capacity, buf.shape[3]))
                    if capacity > buf.shape[2]
                    else buf
                )
                fresh[:, :, :size] = buf[:, :, self.start : self.end].clone()
                grown.append(fresh)
            self._bufs, self.start, self.end = grown, 0, size
        for buf, x in zip(self._bufs, new, strict=True):
            buf[:, :, self.end : self.end + n] = x
        self.end += n
        views = [buf[:, :, self.start : self.end] for buf in self._bufs]
        self.start = max(self.start, self.end - keep)
        return views


class StaticKV(NamedTuple):
    """Fixed-shape ring-buffer cache of the traced/exported step (:mod:`models.static_step`).

    ``k`` [B, H, Dh, C] (transposed, so that the queries' product with it reads contiguous memory) and ``v``
    [B, H, C, Dh] hold the keys/values of the last ``context_frames`` (C) frames in any slot order (attention does
    not depend on the order of its keys), and ``u`` [B, G, C, d/G] (MAE layers) the gate inputs of the same frames.
    ``mask`` [T, C + T] (additive: 0 where visible, -inf where hidden) says what each of the T new frames may see:
    which ring slots (filled, and within its context), then which new frames (itself and the ones before it). The
    step only reads the ring: it returns the new frames' k [B, H, Dh, T], v and u [.., T, ..] and the host writes
    those into the oldest slots, so no step copies the cache (:mod:`enhance.fixed_step`).
    """

    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor
    u: torch.Tensor | None = None


class MultiHeadAttention(nn.Module):
    """Banded causal self-attention on ``[B, T, G, d_model / G]`` (G = ``cfg.n_groups``)."""

    def __init__(self, cfg: AttentionConfig, mae: MAEConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        g, d_group = cfg.n_groups, cfg.d_model // cfg.n_groups
        self.q = GroupLinear(g, d_group, d_group)
        self.k = GroupLinear(g, d_group, d_group)
        self.v = GroupLinear(g, d_group, d_group)
        self.o = GroupLinear(g, d_group, d_group)
        # mixture of attentive experts: per-head weights from a causal gate (None: plain multi-head attention)
        self.mae = None if mae is None else MAEGate(g, d_group, cfg.n_heads // g, mae)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t = x.shape[:2]
        # [B, T, G, d/G] -> [B, T, H, Dh] (heads of mechanism g are g*H/G ... (g+1)*H/G-1) -> [B, H, T, Dh]
        return x.reshape(b, t, self.cfg.n_heads, self.cfg.head_dim).transpose(1, 2)

    def fused_qkv(self, x: torch.Tensor, before: GroupLinear | None = None) -> tuple[torch.Tensor, ...]:
        """Q, K and V as one product with concatenated weights, for the traced/exported step; ``before``, another
        map of the same input (TIM's competition score), joins the same product and its output comes first. The
        weights are parameters only, so tracing with freezing (TorchScript) or exporting (ONNX) folds them into one
        constant: one call per frame instead of three or four. (The attention scale stays a product with q, not
        folded into its weights: int8 quantises a joint weight with one scale, and a scaled-down Q would use a
        fraction of its range.)"""
        return fused_group_linear(x, ([before] if before is not None else []) + [self.q, self.k, self.v])

    def forward(
        self,
        x: torch.Tensor,
        cache: KVCache | StaticKV | None = None,
        qkv: tuple[torch.Tensor, ...] | None = None,
    ) -> tuple[torch.Tensor, KVCache | StaticKV | None]:
        """Offline (``cache`` None): the whole sequence. Incremental: ``x`` holds the frames that follow those of
        ``cache`` (empty tensors at the start); returns the updated cache. ``qkv``: :meth:`fused_qkv` of ``x``
        when the caller already computed it (static step only)."""
        b, t, g, dg = x.shape
        assert qkv is None or isinstance(cache, StaticKV), "qkv is for the static step"
        if isinstance(cache, StaticKV):  # traced/exported step: Q, K and V in one product (see fused_qkv)
            q, k, v = (self._heads(part) for part in (qkv if qkv is not None else self.fused_qkv(x)))
        else:
            q, k, v = self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        u = x.transpose(1, 2) if self.mae is not None else None  # MAE gate input [B, G, T, d/G]
        ctx = self.cfg.context_frames
        if cache is None:
            p = self.cfg.attn_dropout if self.training else 0.0
            y = banded_attention(q, k, v, ctx, p)  # [B, H, T, Dh]
            mean = None if u is None else windowed_mean(u, t, ctx)
        elif isinstance(cache, StaticKV):  # T new frames against the C ring slots (traced / exported step)
            # written out (not SDPA): exporters have mishandled SDPA's boolean masks. The new frames' scores are
            # computed apart from the cached ones' so the cache is read in place, never concatenated.
            q = q * self.cfg.head_dim**-0.5
            cached = torch.matmul(q, cache.k)  # [B, H, T, C]: the ring stores keys transposed [B, H, Dh, C]
            current = torch.matmul(q, k.transpose(-1, -2))  # [B, H, T, T]
            scores = torch.cat([cached, current], dim=-1) + cache.mask  # additive: 0 visible, -inf hidden
            probs = torch.softmax(scores, dim=-1)
            n_slots = cached.shape[-1]
            y = torch.matmul(probs[..., :n_slots], cache.v) + torch.matmul(probs[..., n_slots:], v)
            mean = None
            if u is not None:
                assert cache.u is not None, "an MAE layer's static cache needs the gate inputs u"
                w = (cache.mask == 0).to(u.dtype)  # [T, C + T]: the frames each query sees, the gate's window
                total = torch.matmul(w[:, :n_slots], cache.u) + torch.matmul(w[:, n_slots:], u)
                mean = total / w.sum(dim=-1, keepdim=True)
            # the new frames' entries, for the host to store
            cache = StaticKV(k.transpose(-1, -2), v, cache.mask, u)
        else:
            past = cache.end - cache.start
            # later queries see lags <= ctx: the last ctx frames
            views = cache.extend(*(part for part in (k, v, u) if part is not None), keep=ctx)
            keys, values = views[0], views[1]
            if t == 1:  # one new frame sees every cached one: no mask needed
                y = F.scaled_dot_product_attention(q, keys, values)
            else:
                mask = banded_causal_mask(t, past + t, ctx, query_offset=past, device=x.device)
                y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            mean = None if u is None else windowed_mean(views[2], t, ctx)
        if self.mae is not None:
            assert mean is not None
            y = y * self.mae(mean)  # [B, H, T, Dh] * [B, H, T, 1]
        y = y.transpose(1, 2).reshape(b, t, g, dg)
        return self.o(y), cache

    def empty_cache(self, batch: int, like: torch.Tensor) -> KVCache:
        capacity = 2 * self.cfg.context_frames + 16
        shape = (batch, self.cfg.n_heads, capacity, self.cfg.head_dim)
        g = self.cfg.n_groups
        u = None if self.mae is None else like.new_zeros(batch, g, capacity, self.cfg.d_model // g)
        return KVCache(like.new_zeros(shape), like.new_zeros(shape), u)
