"""Training data through the product's DC blocker (:mod:`enhance.dc_blocker`), as the engines feed the model.

Every inference path (offline, streaming, the server) puts the 5-Hz high-pass in front of the model since session
25; a model trained on unfiltered mixtures then sees inputs that differ from its training data below about 20 Hz.
With ``DataConfig.dc_blocker`` on (the default for new runs), each training example's mixture *and* clean target go
through the same blocker, from the segment's first sample as the product filters a file from its first (so a
crop from inside a file with an offset starts with the blocker's 30-ms settling, which the product has only at
the start of a file). The blocker is linear, so the filtered mixture is still the filtered speech plus the
filtered noise, and the target is what the network can reach from its input. Validation (``recipes.validation.validate``) filters its noisy input the
same way; its SI-SDR is measured against the unfiltered clean file, as ``recipes.evaluate`` measures it.
"""

from __future__ import annotations

import numpy as np
import torch

from enhance.dc_blocker import remove_dc
from enhance.stft import STFTConfig
from recipes.mixing import MixingDataset
from recipes.paired_crops import PairedDataset

# the engines filter in hop-aligned blocks: the same samples as they give the model
HOP = STFTConfig().hop_length


def dc_blocked(wav: np.ndarray) -> np.ndarray:
    """A 1-D signal through the blocker from silence, same dtype."""
    return remove_dc(wav[None], HOP)[0]


class DCBlockedDataset(torch.utils.data.Dataset):
    """A recipe's training examples (``(noisy, clean)``, addressed by ``(epoch, index)``) with both signals through
    the DC blocker; the order and every random draw stay the inner dataset's."""

    def __init__(self, inner: MixingDataset | PairedDataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def order(self, epoch: int) -> np.ndarray:
        return self.inner.order(epoch)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        noisy, clean = self.inner[key]
        return torch.from_numpy(dc_blocked(noisy.numpy())), torch.from_numpy(dc_blocked(clean.numpy()))
