"""Sampled floats are rounded where they are born (Space.sample), so the config, the launch command
and every display show the same short value: on the param's step grid, or 4 significant digits."""

from __future__ import annotations

from decimal import Decimal

import optuna

from harness.engines import EngineSettings, ModelChoice, get_engine
from search.commands.show import fmt_number as _fmt
from search.space.space import parse_space


def _space() -> object:
    return parse_space({
        "name": "floats",
        "engines": {"llamacpp": {"dialect": "llamacpp", "command": ["/bin/llama-server"]}},
        "models": [{"name": "m", "path": "/m.gguf"}],
        "params": {
            "defrag_thold": {"type": "float", "low": 0.0, "high": 1.0},
            "rope_freq_scale": {"type": "float", "low": 0.1, "high": 0.9, "step": 0.05},
            "lr_like": {"type": "float", "low": 1e-5, "high": 1e-1, "log": True},
            "offset_grid": {"type": "float", "low": 0.25, "high": 1.75, "step": 0.5},
        },
        "workloads": [{"name": "qa", "streams": ["qa"]}],
        "objectives": [{"metric": "qa.output_tok_s"}],
    })


def _significant(x: float) -> int:
    return len(Decimal(repr(x)).normalize().as_tuple().digits)


def test_sampled_floats_are_short_and_the_command_shows_the_same_text() -> None:
    space = _space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    engine = get_engine("llamacpp")
    settings = EngineSettings(name="llamacpp", dialect="llamacpp", command=("/bin/llama-server",))
    for _ in range(30):
        trial = study.ask()
        config = space.sample(trial)  # type: ignore[attr-defined]
        v = config.values
        assert _significant(v["defrag_thold"]) <= 4 and 0.0 <= v["defrag_thold"] <= 1.0
        assert _significant(v["lr_like"]) <= 4 and 1e-5 <= v["lr_like"] <= 1e-1
        # on the step grid, with no binary residue (0.30000000000000004)
        assert len(repr(v["rope_freq_scale"]).split(".")[1]) <= 2
        assert round((v["rope_freq_scale"] - 0.1) / 0.05, 9) % 1 == 0
        assert v["offset_grid"] in (0.25, 0.75, 1.25, 1.75)
        flags, _, _ = space.split(config)  # type: ignore[attr-defined]
        argv = engine.build_launch(settings, ModelChoice("m", "/m.gguf"), flags, {}, 8000).argv
        for name in ("defrag_thold", "rope_freq_scale", "lr_like"):
            flag = "--" + name.replace("_", "-")
            shown = f"{name}={v[name]}"  # how the study table and the report print a param
            assert argv[argv.index(flag) + 1] == shown.split("=", 1)[1]
        study.tell(trial, 1.0)


def test_a_fixed_value_given_at_full_precision_is_rounded_too() -> None:
    space = _space()
    config = space.sample(optuna.trial.FixedTrial({  # type: ignore[attr-defined]
        "defrag_thold": 0.24691424506821164, "rope_freq_scale": 0.30000000000000004, "lr_like": 0.0123456789,
        "offset_grid": 1.25}))
    assert config.values["defrag_thold"] == 0.2469
    assert repr(config.values["rope_freq_scale"]) == "0.3"
    assert config.values["lr_like"] == 0.01235


def test_measured_numbers_never_print_in_exponent_form_when_large() -> None:
    assert _fmt(1234.5) == "1230" and _fmt(98765.4, 4) == "98770"
    assert _fmt(12.3456) == "12.3" and _fmt(0.5) == "0.5" and _fmt(None) == "-"
    assert _fmt(0.0000123) == "1.23e-05"  # tiny values keep their exponent: no zero run to count
