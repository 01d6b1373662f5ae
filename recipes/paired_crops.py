"""Paired training data (VoiceBank-DEMAND style: each noisy file has its clean twin), random crops per epoch."""

from __future__ import annotations

import numpy as np
import torch

from recipes.audio_pool import AudioPool


class PairedDataset(torch.utils.data.Dataset):
    """Aligned noisy/clean crops of ``segment`` samples; short pairs are zero-padded at a random place.

    Same contract as :class:`recipes.mixing.MixingDataset`: items are addressed by ``(epoch, index)`` and depend
    only on ``(seed, epoch, index)``.
    """

    def __init__(self, noisy: AudioPool, clean: AudioPool, segment: int, seed: int) -> None:
        if len(noisy) != len(clean) or len(noisy) == 0:
            raise ValueError(
                f"need the same non-zero number of noisy and clean files ({len(noisy)} vs {len(clean)})"
            )
        self.noisy, self.clean, self.segment, self.seed = noisy, clean, segment, seed

    def __len__(self) -> int:
        return len(self.noisy)

    def order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch, 0]).permutation(len(self))

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, i = key
        rng = np.random.default_rng([self.seed, epoch, 1, i])
        n = min(self.noisy.frames[i], self.clean.frames[i])
        noisy = np.zeros(self.segment, np.float32)
        clean = np.zeros(self.segment, np.float32)
        if n >= self.segment:
            start = int(rng.integers(0, n - self.segment + 1))
            noisy[:] = self.noisy.read(i, start, start + self.segment)
            clean[:] = self.clean.read(i, start, start + self.segment)
        else:
            at = int(rng.integers(0, self.segment - n + 1))
            noisy[at : at + n] = self.noisy.read(i, 0, n)
            clean[at : at + n] = self.clean.read(i, 0, n)
        return torch.from_numpy(noisy), torch.from_numpy(clean)
