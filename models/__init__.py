"""Networks and checkpoints: the TIM enhancer, its building blocks, named configs and checkpoint files."""

from models.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from models.enhancer import Enhancer, EnhancerConfig, EnhancerOutput, count_parameters
from models.registry import PAPER_CONFIGS, REGISTRY, get_config

__all__ = [
    "PAPER_CONFIGS",
    "REGISTRY",
    "Checkpoint",
    "CheckpointError",
    "Enhancer",
    "EnhancerConfig",
    "EnhancerOutput",
    "count_parameters",
    "get_config",
    "load_checkpoint",
    "save_checkpoint",
]
