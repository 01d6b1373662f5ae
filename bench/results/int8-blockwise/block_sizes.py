"""Session 29: bench/bench_int8.py with the onnxruntime-int8 step's weights quantised another way, to choose the
block size of enhance/onnx_graph.py and compare with the per-tensor quantiser it replaced.

    python bench/results/int8-blockwise/block_sizes.py 32|64|128|tensor [bench_int8.py's arguments]

e.g. ``... 64 --pairs ../shared/data --limit 20 --no-dnsmos --calls 50 --seconds 2 --out
bench/results/int8-blockwise/block-64`` (from the repository root).
"""

import functools
import os
import sys
from pathlib import Path

os.environ["OMP_NUM_THREADS"] = "1"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(HERE)]

import bench_int8  # noqa: E402

import enhance.onnx_backend as onnx_backend  # noqa: E402
from enhance import onnx_graph  # noqa: E402

choice, rest = sys.argv[1], sys.argv[2:]
if choice == "tensor":
    from ab_engine import per_tensor_step

    onnx_backend.quantize_step = per_tensor_step
else:
    onnx_graph.quantize_graph = functools.partial(onnx_graph.quantize_graph, block_size=int(choice))
sys.exit(bench_int8.main(rest))
