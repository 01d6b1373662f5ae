"""What the streaming engine asks of a backend (:mod:`enhance.backends` chooses one): the contract, as Protocols.

Every backend steps the model; some also run the per-frame signal path (analysis, synthesis, overlap-add) and
then the engine hands them whole frames. The state each keeps is its own (``EnhancerState`` for PyTorch,
``FixedState`` for TorchScript and onnxruntime, ``NativeState`` for the C step); the engine only carries it and
reads how many frames it has output.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from models.enhancer import EnhancerOutput


class BackendState(Protocol):
    frames_out: int  # output frames produced so far


class StepBackend(Protocol):
    """``Enhancer`` itself (PyTorch), ``TracedStepper``, ``OnnxStepper``, ``NativeStepper``."""

    def new_state(self, batch: int) -> Any:
        """An empty state for ``batch`` channels (a :class:`BackendState`)."""

    def step(
        self, feats: torch.Tensor, state: Any, final: bool = False, return_competition: bool = False
    ) -> tuple[EnhancerOutput, Any]:
        """New log-magnitude frames [B, n, F] -> the output frames they complete, and the new state."""


@runtime_checkable
class FrameBackend(StepBackend, Protocol):
    """A backend that also runs the signal path of each frame (NumPy or C): the engine then calls this."""

    def run_frames(
        self,
        samples: np.ndarray,
        n: int,
        final: bool,
        state: Any,
        pending: np.ndarray,
        tail: np.ndarray,
        return_competition: bool = False,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """``n`` new frames of ``samples`` [B, (n - 1) * hop + win] -> final samples [B, m * hop] and competition
        maps per TIM block; ``pending`` and ``tail`` are updated in place."""
