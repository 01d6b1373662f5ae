"""OpenMP's waiting policy for the commands (``enhance-cli``, ``enhance-server``, ``python -m recipes.evaluate``):
``PASSIVE`` unless the user set ``OMP_WAIT_POLICY``. The OpenMP runtime reads it once, when torch loads it, so each
command module imports this module before anything that imports torch.

Why: by default idle OpenMP threads spin while they wait for work. On a machine whose cores are busy with other
processes the spinning threads compete with those (and with each other), and a command ran several times slower;
with the threads sleeping instead, it costs nothing measurable on an idle machine (README.md, "Speed and memory";
``bench/bench_wait_policy.py`` measures it). The library itself (``import enhance``) leaves the setting alone.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
