"""Session 29: how much the onnxruntime steps' output depends on how many frames go through the step per call.
The first 3 s of examples/noisy.wav streamed in 16-ms chunks (the one-frame step), 32-ms chunks (two frames per
call) and 256-ms chunks (16), for the float32 step, the blockwise 8-bit step (now) and the per-tensor int8 step
(before session 29); prints the largest sample difference to the 16-ms run.

    python bench/results/int8-blockwise/frames_per_call.py    # from the repository root
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(HERE)]

import numpy as np  # noqa: E402
import soundfile as sf  # noqa: E402
import torch  # noqa: E402
from ab_engine import per_tensor_step  # noqa: E402

import enhance.onnx_backend as onnx_backend  # noqa: E402
from enhance.backends import streaming_backend  # noqa: E402
from enhance.streaming import StreamingEnhancer  # noqa: E402
from models.pretrained import load_pretrained  # noqa: E402


def main() -> int:
    torch.set_num_threads(1)
    model = load_pretrained("default").model
    wav, rate = sf.read(ROOT / "examples" / "noisy.wav", dtype="float32")
    x = wav[None, : 3 * rate]
    blockwise = onnx_backend.quantize_step
    backends = {
        "float32 (onnxruntime)": lambda: streaming_backend(model, "onnxruntime"),
        "8-bit per block (onnxruntime-int8 now)": lambda: streaming_backend(model, "onnxruntime-int8"),
    }
    print("| step | 32-ms chunks vs 16-ms | 256-ms chunks vs 16-ms |\n|---|---|---|")
    for label, make in [*backends.items(), ("int8 per tensor (before session 29)", None)]:
        if make is None:
            onnx_backend.quantize_step = per_tensor_step
            backend = streaming_backend(model, "onnxruntime-int8")
            onnx_backend.quantize_step = blockwise
        else:
            backend = make()
        runs = []
        for chunk in (256, 512, 4096):
            engine = StreamingEnhancer(model, backend=backend)
            pieces = [engine.process(x[:, i : i + chunk]) for i in range(0, x.shape[1], chunk)]
            runs.append(np.concatenate([*pieces, engine.flush()], axis=1))
        print(f"| {label} | {np.abs(runs[1] - runs[0]).max():.2e} | {np.abs(runs[2] - runs[0]).max():.2e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
