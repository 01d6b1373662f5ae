"""Mixture of attentive experts (models/mae.py) and its block-coordinate-descent training (recipes/bcd.py).

The mixture must equal the paper's definition (a gate-weighted sum of h experts, each all heads but one), a uniform
gate must be plain multi-head attention, the causal gate must not see the future, streaming is covered with the
other configs in test_streaming.py, and BCD must freeze exactly what it says.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from models.attention import AttentionConfig, MultiHeadAttention
from models.enhancer import Enhancer, count_parameters
from models.mae import MAEConfig, MAEGate, gate_parameter_names, set_mae_mode, windowed_mean
from models.registry import MAE_CONFIGS, get_config
from recipes.bcd import BCD, BCDConfig


def _attention(n_groups: int, ctx: int = 3, mae: bool = True) -> MultiHeadAttention:
    torch.manual_seed(0)
    cfg = AttentionConfig(d_model=16, n_heads=4, n_groups=n_groups, context_frames=ctx)
    return MultiHeadAttention(cfg, MAEConfig(hidden=8) if mae else None).double().eval()


def _x(n_groups: int, t: int = 9, b: int = 2) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(b, t, n_groups, 16 // n_groups, dtype=torch.float64)


def test_windowed_mean_is_the_mean_of_the_frames_attention_sees() -> None:
    u = torch.randn(2, 3, 11, 5, dtype=torch.float64)
    for ctx in (0, 1, 4, 20):
        got = windowed_mean(u, 11, ctx)
        want = torch.stack([u[:, :, max(0, t - ctx) : t + 1].mean(dim=2) for t in range(11)], dim=2)
        torch.testing.assert_close(got, want)
    # the last queries of a cache view (the context before them, then them) give the same numbers
    ctx = 4
    view = u[:, :, 7 - ctx :]  # frames 3..10, queries 7..10
    torch.testing.assert_close(windowed_mean(view, 4, ctx), windowed_mean(u, 11, ctx)[:, :, 7:])


@pytest.mark.parametrize("n_groups", [1, 2])
def test_mixture_is_the_gate_weighted_sum_of_h_minus_one_head_experts(n_groups: int) -> None:
    attn = _attention(n_groups)
    assert attn.mae is not None
    x = _x(n_groups)
    t = x.shape[1]
    hg = attn.cfg.n_heads // n_groups
    y, _ = attn(x)
    # experts by definition: the plain attention with head i of a mechanism removed, rescaled by Hg/(Hg-1)
    gate = attn.mae.gate(windowed_mean(x.transpose(1, 2), t, attn.cfg.context_frames))  # [B, T, G, Hg]
    plain = _attention(n_groups, mae=False)
    plain.load_state_dict({k: v for k, v in attn.state_dict().items() if not k.startswith("mae.")})
    want = torch.zeros_like(y)
    for i in range(hg):
        keep = torch.ones(attn.cfg.n_heads, dtype=torch.float64)
        keep[[grp * hg + i for grp in range(n_groups)]] = 0.0
        expert = _masked_heads(plain, x, keep * hg / (hg - 1))  # [B, T, G, dg]
        want += gate[..., i].unsqueeze(-1) * expert
    torch.testing.assert_close(y, want)


def _masked_heads(attn: MultiHeadAttention, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Plain attention with head j's output scaled by weights[j] before the output projection."""
    captured: dict[str, torch.Tensor] = {}
    b, t, g, dg = x.shape

    def scale(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor]:
        heads = args[0].reshape(b, t, attn.cfg.n_heads, attn.cfg.head_dim) * weights.view(1, 1, -1, 1)
        captured["done"] = heads
        return (heads.reshape(b, t, g, dg),)

    hook = attn.o.register_forward_pre_hook(scale)
    try:
        y, _ = attn(x)
    finally:
        hook.remove()
    assert "done" in captured
    return y


def test_uniform_gate_is_plain_multi_head_attention() -> None:
    attn = _attention(2)
    assert attn.mae is not None
    torch.nn.init.zeros_(attn.mae.fc2.weight)
    torch.nn.init.zeros_(attn.mae.fc2.bias)  # uniform gate: every head weighted Hg/(Hg-1) * (1 - 1/Hg) = 1
    plain = _attention(2, mae=False)
    plain.load_state_dict({k: v for k, v in attn.state_dict().items() if not k.startswith("mae.")})
    x = _x(2)
    torch.testing.assert_close(attn(x)[0], plain(x)[0])
    # a trained (non-uniform) gate changes the function
    torch.nn.init.normal_(attn.mae.fc2.weight, std=1.0)
    assert not torch.allclose(attn(x)[0], plain(x)[0])


def test_gate_never_sees_the_future() -> None:
    attn = _attention(1, ctx=20)
    x = _x(1, t=12)
    y, _ = attn(x)
    x2 = x.clone()
    x2[:, 8:] += 5.0  # change frames 8.. only
    y2, _ = attn(x2)
    torch.testing.assert_close(y[:, :8], y2[:, :8])
    assert not torch.allclose(y[:, 8:], y2[:, 8:])


def test_sample_mode_uses_exactly_one_expert_per_example_and_mechanism() -> None:
    attn = _attention(2)
    assert attn.mae is not None
    x = _x(2, b=3)
    b, t = x.shape[:2]
    mean = windowed_mean(x.transpose(1, 2), t, attn.cfg.context_frames)
    set_mae_mode(attn, "sample")
    torch.manual_seed(5)
    w = attn.mae(mean)  # [B, H, T, 1]
    set_mae_mode(attn, "mixture")
    hg = attn.cfg.n_heads // 2
    w = w[..., 0].reshape(b, 2, hg, t)
    assert torch.all(w == w[..., :1])  # one choice for the whole example
    dropped = (w[..., 0] == 0).sum(dim=-1)  # per example and mechanism
    assert torch.all(dropped == 1)
    assert torch.allclose(w[..., 0].sum(dim=-1), torch.full((b, 2), float(hg), dtype=w.dtype))
    with pytest.raises(ValueError, match="mode"):
        set_mae_mode(attn, "hard")


@pytest.mark.parametrize("name", ["tiny+mae", "tiny-transformer+mae", "tim+mae"])
def test_gates_exist_where_configured_and_get_gradients(name: str) -> None:
    cfg = get_config(name)
    model = Enhancer(cfg)
    gated = {int(k.split(".")[1]) + 1 for k in gate_parameter_names(model)}
    assert gated == set(cfg.mae_blocks) and gated
    model(torch.rand(2, 12, 257) * 3).log_mag.square().mean().backward()
    grads = {k: p.grad for k, p in model.named_parameters() if k in gate_parameter_names(model)}
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads.values())


@pytest.mark.parametrize("name", MAE_CONFIGS)
def test_mae_configs_are_param_matched_within_ten_percent(name: str) -> None:
    base = count_parameters(Enhancer(get_config(name.split("+")[0])))
    assert abs(count_parameters(Enhancer(get_config(name))) - base) / base < 0.10


def test_mae_refuses_bad_configs() -> None:
    with pytest.raises(ValueError, match="2 heads"):
        MAEGate(2, 8, 1, MAEConfig())
    with pytest.raises(ValueError, match="mae_blocks"):
        from models.enhancer import EnhancerConfig

        EnhancerConfig(mae_blocks=(1,))


# ----------------------------------------------------------------------------------------------------- BCD


def _bcd_step(model: Enhancer, opt: torch.optim.Optimizer, bcd: BCD, step: int) -> str:
    phase = bcd.before_forward(step)
    opt.zero_grad(set_to_none=True)
    model(torch.rand(2, 10, 257) * 3).log_mag.square().mean().backward()
    bcd.after_backward(phase)
    opt.step()
    return phase


def test_bcd_updates_only_the_gates_in_g_steps_and_only_the_experts_in_f_steps() -> None:
    torch.manual_seed(0)
    model = Enhancer(get_config("tiny+mae")).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    bcd = BCD(model, BCDConfig(g_steps=1, f_steps=2))
    gates = bcd.gate_names
    assert gates and len(gates) < len(list(model.parameters()))
    phases = []
    for step in range(6):
        before = {k: p.detach().clone() for k, p in model.named_parameters()}
        phase = _bcd_step(model, opt, bcd, step)
        phases.append(phase)
        changed = {k for k, p in model.named_parameters() if not torch.equal(p, before[k])}
        if phase == "G":
            assert changed == gates  # every gate moved, nothing else (Adam's moments included)
        else:
            assert changed and not (changed & gates)
        assert all(g.mode == "mixture" for g in model.modules() if isinstance(g, MAEGate))
    assert phases == ["G", "F", "F", "G", "F", "F"]


def test_bcd_needs_an_mae_model() -> None:
    with pytest.raises(ValueError, match="MAE gates"):
        BCD(Enhancer(get_config("tiny")), BCDConfig())
    with pytest.raises(ValueError, match="g_steps"):
        BCDConfig(g_steps=0)


def test_bcd_trains_from_a_config_file_end_to_end(tmp_path: Path) -> None:
    """The trainer with ``bcd`` set: a tiny MAE run on generated folders finishes with finite losses."""
    from recipes.train import main as train_main
    from tests.audio_trees import build_folders

    tree = build_folders(tmp_path / "data")
    config = tmp_path / "bcd.json"
    config.write_text(json.dumps({"train": {"model": "tiny+mae", "bcd": {"g_steps": 1, "f_steps": 1}}}))
    code = train_main(
        [
            *("--config", str(config), "--recipe", "folders"),
            *("--speech", str(tree.speech), "--noise", str(tree.noise), "--val-pairs", str(tree.dev)),
            *("--epochs", "1", "--batch-size", "2", "--segment-seconds", "1.0", "--threads", "1"),
            *("--max-steps-per-epoch", "4", "--out", str(tmp_path / "run")),
        ]
    )
    assert code == 0
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert len(rows) == 2 and "nan" not in rows[1].lower()
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["train"]["bcd"] == {"g_steps": 1, "f_steps": 1}


def test_bcd_run_extended_by_resume_equals_the_longer_run(tmp_path: Path) -> None:
    """Exact resume with BCD: F steps draw experts from the global RNG, which the run state must restore. A run of
    1 epoch resumed to 2 (``--resume --epochs 2``) ends bit for bit where a 2-epoch run ends."""
    import safetensors.torch

    from recipes.train import main as train_main
    from tests.audio_trees import build_folders

    tree = build_folders(tmp_path / "data")
    config = tmp_path / "bcd.json"
    config.write_text(json.dumps({"train": {"model": "tiny+mae", "bcd": {"g_steps": 1, "f_steps": 2}}}))
    common = [
        *("--config", str(config), "--recipe", "folders"),
        *("--speech", str(tree.speech), "--noise", str(tree.noise), "--val-pairs", str(tree.dev)),
        *("--batch-size", "2", "--segment-seconds", "1.0", "--threads", "1", "--max-steps-per-epoch", "3"),
    ]
    assert train_main([*common, "--epochs", "2", "--out", str(tmp_path / "a")]) == 0
    assert train_main([*common, "--epochs", "1", "--out", str(tmp_path / "b")]) == 0
    assert train_main(["--out", str(tmp_path / "b"), "--resume", "--epochs", "2"]) == 0
    a = safetensors.torch.load_file(tmp_path / "a" / "last.safetensors")
    b = safetensors.torch.load_file(tmp_path / "b" / "last.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed BCD run ended at other weights"
