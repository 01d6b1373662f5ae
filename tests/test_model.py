"""The network: causality and lookahead, attention context, competition, parameter counts, learning."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from models import PAPER_CONFIGS, REGISTRY, Enhancer, count_parameters, get_config
from models.attention import banded_attention, banded_causal_mask
from models.registry import MAE_CONFIGS, SDU_CONFIGS, paper_config, tiny_config
from models.tim_layer import TIMLayer

ROOT = Path(__file__).resolve().parents[1]


def _model(cfg, seed: int = 0) -> Enhancer:
    torch.manual_seed(seed)
    return Enhancer(cfg).double().eval()


def _outputs_up_to(model: Enhancer, x: torch.Tensor, t: int) -> torch.Tensor:
    with torch.no_grad():
        return model(x).log_mag[:, : t + 1]


@pytest.mark.parametrize("name", list(REGISTRY))
def test_output_never_depends_on_frames_beyond_lookahead(name: str) -> None:
    cfg = get_config(name)
    model = _model(cfg)
    la = cfg.lookahead_frames
    x = torch.rand(1, 24, 257, dtype=torch.float64) * 3
    for t in (0, 5, 17):
        y = x.clone()
        y[:, t + la + 1 :] = torch.rand_like(y[:, t + la + 1 :]) * 3
        assert torch.equal(_outputs_up_to(model, x, t), _outputs_up_to(model, y, t)), (
            f"frame {t} saw the future"
        )
        # ... and the lookahead frame itself is really used (the test above could pass with a dead network)
        z = x.clone()
        z[:, t + la] += 1.0
        assert not torch.allclose(_outputs_up_to(model, x, t)[:, t], _outputs_up_to(model, z, t)[:, t])


@pytest.mark.parametrize("n_mech,comp", [(1, True), (2, True), (2, False), (4, True)])
def test_frames_older_than_the_receptive_field_change_nothing(n_mech: int, comp: bool) -> None:
    # paper-sized layers with a short attention context, and the tiny model
    for cfg in (
        paper_config(n_mech, competition=comp, context_frames=3),
        tiny_config(n_mech, comp, context_frames=2),
    ):
        model = _model(cfg)
        past = cfg.receptive_past_frames
        t = past + 6
        x = torch.rand(1, t + 4, 257, dtype=torch.float64) * 3
        y = x.clone()
        y[:, : t - past] = torch.rand_like(y[:, : t - past]) * 3  # everything older than the receptive field
        with torch.no_grad():
            assert torch.equal(model(x).log_mag[:, t], model(y).log_mag[:, t])
            z = x.clone()
            z[:, t - past] += 1.0  # the oldest frame inside the receptive field does matter (weakly, after
            assert not torch.equal(model(x).log_mag[:, t], model(z).log_mag[:, t])  # 8 attention hops)


def test_banded_mask_shape_and_band() -> None:
    m = banded_causal_mask(5, 5, context_frames=2)
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [0, 1, 1, 1, 0],
            [0, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(m, expected)


def test_blockwise_attention_equals_one_block() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 300, 8, dtype=torch.float64) for _ in range(3))
    ctx = 20  # block = 64 frames, 300 > 2 * 64: the blockwise path runs
    full = F.scaled_dot_product_attention(q, k, v, attn_mask=banded_causal_mask(300, 300, ctx))
    assert torch.allclose(banded_attention(q, k, v, ctx), full, atol=1e-12)


@pytest.mark.parametrize(
    "name,n_s,n_maps", [("tim", 2, 5), ("tim4", 4, 5), ("tiny", 2, 1), ("tiny-tim4", 4, 1)]
)
def test_competition_maps_are_distributions(name: str, n_s: int, n_maps: int) -> None:
    model = _model(get_config(name))
    x = torch.rand(3, 11, 257, dtype=torch.float64) * 3
    out = model(x, return_competition=True)
    assert out.competition is not None and len(out.competition) == n_maps
    for c in out.competition:
        assert c.shape == (3, 11, n_s)
        assert torch.allclose(c.sum(-1), torch.ones(3, 11, dtype=torch.float64))
        assert (c > 0).all()
    assert model(x).competition is None  # only on request


@pytest.mark.parametrize("name", ["transformer", "tim-nocomp", "tiny-transformer", "tiny-nocomp"])
def test_models_without_competition_return_no_maps(name: str) -> None:
    model = _model(get_config(name))
    out = model(torch.rand(1, 5, 257, dtype=torch.float64), return_competition=True)
    assert out.competition == []


def test_nocomp_is_tim_with_competition_fixed_to_one() -> None:
    comp = TIMLayer(tiny_config(2, True).tim).double().eval()  # type: ignore[arg-type]
    nocomp = TIMLayer(tiny_config(2, False).tim).double().eval()  # type: ignore[arg-type]
    assert nocomp.score is None and not any("score" in k for k in nocomp.state_dict())
    state = {k: v for k, v in comp.state_dict().items() if not k.startswith("score.")}
    nocomp.load_state_dict(state, strict=True)
    h = torch.randn(2, 9, 16, dtype=torch.float64)
    with torch.no_grad():
        y_nocomp, c_nocomp, _ = nocomp(h)
        y_comp, c_comp, _ = comp(h)
        assert c_nocomp is None and c_comp is not None
        assert not torch.allclose(y_nocomp, y_comp)  # competition really scales the attention update
        comp.competition = lambda h: torch.ones(*h.shape[:3], dtype=h.dtype)  # type: ignore[method-assign]
        y_forced, _, _ = comp(h)
    assert torch.allclose(y_forced, y_nocomp, atol=1e-12)


@pytest.mark.parametrize("name", PAPER_CONFIGS + SDU_CONFIGS + MAE_CONFIGS)
def test_paper_configs_have_about_six_million_parameters(name: str) -> None:
    n = count_parameters(Enhancer(get_config(name)))
    assert 5.4e6 <= n <= 6.6e6, f"{name}: {n}"
    # the README's table shows this exact count
    readme = (ROOT / "README.md").read_text()
    row = re.search(rf"^\|\s*`{re.escape(name)}`\s*\|.*$", readme, re.MULTILINE)
    assert row is not None, f"README has no table row for {name}"
    assert f"{n:,}" in row.group(0), f"README row for {name} does not show {n:,}"


def test_variants_are_param_matched_to_the_baseline() -> None:
    counts = [count_parameters(Enhancer(get_config(n))) for n in PAPER_CONFIGS]
    assert max(counts) / min(counts) < 1.01


def test_bad_feature_shapes_are_refused() -> None:
    model = _model(get_config("tiny"))
    with pytest.raises(ValueError, match="expected features"):
        model(torch.rand(1, 5, 100, dtype=torch.float64))
    with pytest.raises(ValueError, match="at least one frame"):
        model(torch.rand(1, 0, 257, dtype=torch.float64))


def test_tiny_model_overfits_one_pair() -> None:
    """The whole path learns: loss on one noisy/clean pair falls 10x within a few hundred steps."""
    from enhance.stft import STFTConfig, log_magnitude, stft
    from tests.conftest import speech_like

    torch.manual_seed(0)
    clean = torch.from_numpy(speech_like(1.0, seed=3))
    noisy = clean + 0.03 * torch.randn_like(clean)
    x = log_magnitude(stft(noisy, STFTConfig())).unsqueeze(0)
    y = log_magnitude(stft(clean, STFTConfig())).unsqueeze(0)
    model = Enhancer(get_config("tiny"))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(300):
        loss = F.mse_loss(model(x).log_mag, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 10, (losses[0], losses[-1])


def test_attenuation_limit_applies_in_eval_only() -> None:
    import dataclasses

    cfg = dataclasses.replace(get_config("tiny"), max_attenuation_db=12.0)
    torch.manual_seed(0)
    model = Enhancer(cfg).double()
    x = torch.rand(2, 30, 257, dtype=torch.float64) * 3
    floor = torch.log1p((torch.exp(x) - 1) * 10 ** (-12 / 20))
    model.eval()
    with torch.no_grad():
        limited = model(x).log_mag
        assert (limited >= floor - 1e-12).all()
        model.train()
        torch.manual_seed(1)
        free_train = model(x).log_mag
        model.cfg = dataclasses.replace(cfg, max_attenuation_db=None)
        model.eval()
        free = model(x).log_mag
    assert (free < floor - 1e-6).any()  # the limit did something...
    assert torch.equal(limited, torch.maximum(free, floor))  # ...and nothing else
    assert (free_train < floor - 1e-6).any()  # not applied while training


@pytest.mark.parametrize("name", ["tiny+sdu", "tiny+highway", "tim+sdu"])
def test_sdu_gates_exist_where_configured_and_get_gradients(name: str) -> None:
    cfg = get_config(name)
    model = Enhancer(cfg)
    gated = {int(k.split(".")[1]) + 1 for k, _ in model.named_parameters() if ".sdu_" in k}
    assert gated == set(cfg.sdu_blocks)
    x = torch.rand(2, 12, 257) * 3
    model(x).log_mag.square().mean().backward()
    grads = {k: p.grad for k, p in model.named_parameters() if ".sdu_" in k}
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads.values())


def test_sdu_changes_the_function_and_highway_is_a_gate() -> None:
    from models.sdu import SDUConfig, SDUGate

    torch.manual_seed(0)
    x, y = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    gate = SDUGate(2, 8, SDUConfig(highway=True))
    t = torch.sigmoid(gate.gate(x))
    assert torch.allclose(gate(x, y), t * y + (1 - t) * x)
    sdu = SDUGate(2, 8, SDUConfig(psi="tanh"))
    assert torch.allclose(sdu(x, y), x + y + torch.tanh(sdu.gate(x)) * sdu.value(x))  # type: ignore[misc]
    with pytest.raises(ValueError, match="psi"):
        SDUConfig(psi="relu")


def test_set_max_attenuation_checks_the_limit() -> None:
    model = Enhancer(get_config("tiny"))
    model.set_max_attenuation(float("inf"))
    assert model.cfg.max_attenuation_db is None
    model.set_max_attenuation(0)
    assert model.cfg.max_attenuation_db == 0.0
    for bad in (-3.0, float("nan"), float("-inf")):
        with pytest.raises(ValueError, match="at least 0 dB"):
            model.set_max_attenuation(bad)
    assert model.cfg.max_attenuation_db == 0.0  # a refused limit leaves the model as it was
