"""``sglang-supervisor plan`` offline, and its exit statuses when it cannot plan."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path

from sglang_supervisor_api.cli.plan import add_plan_parser, run_plan
from tests.helpers import free_port

LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}


def plan(*argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    add_plan_parser(parser.add_subparsers(dest="command"))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_plan(parser.parse_args(["plan", *argv]))
    return code, out.getvalue(), err.getvalue()


def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_31_8B))
    return path


def test_offline_table(tmp_path: Path) -> None:
    cfg = config_file(tmp_path)
    code, out, err = plan(
        "--config-json", str(cfg), "--gpus", "1", "--gpu-memory", "80", "--host-ram", "256"
    )
    assert code == 0, err
    assert "bytes per token per rank     131,072  65,536" in out
    assert "kv_cache_dtype = fp8_e4m3 (now auto, SGLang's default)" in out
    assert "does not raise the number of requests decoding at once" in out
    assert "Weights are estimated from config.json" in out


def test_offline_json_with_a_model_directory(tmp_path: Path) -> None:
    config_file(tmp_path)
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.truncate(16_060_522_496)  # sparse
    code, out, _ = plan(
        "--model", str(tmp_path), "--gpus", "8", "--gpu-memory", "140.4", "--avg-tokens", "2000",
        "--host-ram", "1024", "--json",
    )  # fmt: skip
    assert code == 0
    data = json.loads(out)
    assert data["model"]["weight_bytes"] == 16_060_522_496
    assert data["current"]["cell_bytes"] == 16_384  # TP 8: one KV head per rank
    assert data["current_levers"] == {"tp_size": 8}


def test_offline_needs_the_hardware(tmp_path: Path) -> None:
    code, _, err = plan("--config-json", str(config_file(tmp_path)))
    assert code == 2
    assert "offline planning needs --gpus and --gpu-memory" in err


def test_bad_inputs_exit_2(tmp_path: Path) -> None:
    code, _, err = plan("--config-json", str(tmp_path / "missing.json"), "--gpus", "1")
    assert code == 2 and "does not exist" in err
    code, _, err = plan("--config-json", str(config_file(tmp_path)), "--gpus", "0")
    assert code == 2 and "--gpus must be positive" in err


def test_unreachable_daemon_exits_1() -> None:
    code, _, err = plan("--url", f"127.0.0.1:{free_port()}")
    assert code == 1
    assert "cannot reach the daemon" in err and "--url" in err


# --- the pools of hybrid and attention-DP models, as text -------------------------------


def _rendered(model: str, levers: dict[str, object]) -> tuple[dict[str, object], str]:
    from sglang_supervisor import planner
    from sglang_supervisor_api.cli.plan_render import render_plan
    from tests.planner_cases import H200, planner_model

    hw = planner.Hardware(8, H200, 1024 * 2**30)
    data = planner.propose(planner_model(model), hw, levers, avg_tokens=4096).to_json()
    return data, render_plan(data)


def _row(text: str, label: str) -> list[str]:
    """The current and proposed cells of the table row ``label``."""
    for line in text.splitlines():
        if line.startswith(label + "  "):
            return line[len(label) :].split()
    raise AssertionError(f"no row {label!r} in:\n{text}")


def test_sliding_window_pool_is_a_row() -> None:
    data, text = _rendered("gpt-oss-120b", {"tp_size": 8})
    cur = data["current"]
    # swa_full_tokens_ratio 0.8 (pool_configurator.py:786-803): the SWA pool beside the full.
    assert cur["swa_tokens_per_rank"] == int(0.8 * cur["kv_tokens_per_rank"])
    assert _row(text, "sliding-window tokens per rank") == [
        f"{cur['swa_tokens_per_rank']:,}",
        f"{data['proposed']['swa_tokens_per_rank']:,}",
    ]
    assert "Mamba" not in text.split("Levers")[0] and "KV pools" not in text


def test_mamba_pool_and_its_request_cap_are_rows() -> None:
    data, text = _rendered("Qwen3-Next-80B-A3B", {"tp_size": 8})
    cur, new = data["current"], data["proposed"]
    assert _row(text, "Mamba state slots per worker") == [
        f"{cur['mamba_slots_per_rank']:,}",
        f"{new['mamba_slots_per_rank']:,}",
    ]
    # 36 GDN layers × (conv 1024×3 bf16 + SSM 4×128×128 fp32) = 9,658,368 B = 9.2 MiB.
    assert _row(text, "Mamba state per slot") == ["9.2", "MiB", "9.2", "MiB"]
    assert _row(text, "request cap of the slots") == [
        f"{cur['mamba_request_cap']:,}",
        f"{new['mamba_request_cap']:,}",
    ]
    assert "sliding-window tokens" not in text


def test_attention_dp_workers_are_rows() -> None:
    data, text = _rendered("DeepSeek-V3", {"tp_size": 8, "attn_dp_size": 8})
    assert _row(text, "attn_dp_size") == ["8", "8"]
    assert _row(text, "KV pools (DP workers)") == ["8", "8"]
    per_worker = _row(text, "max_running_requests per worker")
    assert per_worker[0] == f"{data['current']['max_running_requests_per_worker']:,}"
    assert per_worker[1] == f"{data['proposed']['max_running_requests_per_worker']:,}"
    # Plain TP8: the planner proposes attention DP for the MLA model; the rows show 1 -> 8.
    data, text = _rendered("DeepSeek-V3", {"tp_size": 8})
    assert data["levers"]["attn_dp_size"] == 8
    assert _row(text, "KV pools (DP workers)") == ["1", "8"]


def test_offline_llama4_is_planned_as_sglangs_hybrid_swa_model() -> None:
    """The offline CLI, Llama-4-Scout at TP8: 12 full + 0.8 × 36 chunked-attention layers
    of 512 B = 20,889.6 B per token (configs/model_config.py:2705-2711,
    pool_configurator.py:786-803), not 48 full layers (24,576); its 10,485,760-token
    context (llama3 rope: no factor, utils/hf_transformers/common.py:681-687)."""
    cfg = Path(__file__).resolve().parents[1] / "data" / "models" / "llama-4-scout" / "config.json"
    code, out, err = plan(
        "--config-json", str(cfg), "--gpus", "8", "--gpu-memory", "140.4", "--host-ram", "512",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    current = json.loads(out)["current"]
    assert current["cell_bytes_exact"] == 20889.6
    assert current["swa_tokens_per_rank"] > 0


KIMI = Path(__file__).resolve().parents[1] / "data" / "models" / "kimi-k2.5"


def test_offline_plans_the_lever_set_given_as_apply_takes_it(tmp_path: Path) -> None:
    """--file then --set (--set wins), lever names as apply reads them, values like TOML;
    a local model_path lever is the model: Kimi-K2.5 at attention DP 8 + fp8 has SGLang's
    default fraction 0.6896 (its vision tower's cut), not DeepSeek's 0.758."""
    levers = tmp_path / "levers.toml"
    levers.write_text(
        f'[levers]\nmodel_path = "{KIMI}"\ntp_size = 8\nattn-dp-size = 4\n'
        '[env]\nNCCL_DEBUG = "INFO"\n'
    )
    code, out, err = plan(
        "--file", str(levers), "--set", "attn_dp_size=8", "--set", "kv_cache_dtype=fp8_e4m3",
        "--gpus", "8", "--gpu-memory", "140.4", "--host-ram", "408", "--json",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data["current_levers"] == {
        "tp_size": 8,
        "model_path": str(KIMI),
        "attn_dp_size": 8,
        "kv_cache_dtype": "fp8_e4m3",
    }
    assert data["current"]["attn_dp_size"] == 8 and data["current"]["cell_bytes"] == 35_136
    assert round(data["current"]["mem_fraction_static"], 4) == 0.6896
    assert data["model"]["architecture"] == "KimiK25ForConditionalGeneration"
    assert any("NCCL_DEBUG" in n and "not planned for" in n for n in data["notes"])


def test_offline_refuses_levers_apply_would_refuse(tmp_path: Path) -> None:
    cfg = str(config_file(tmp_path))
    hw = ("--gpus", "1", "--gpu-memory", "80")
    code, _, err = plan("--config-json", cfg, *hw, "--set", "mem_fraction=0.9")
    assert code == 2 and "the levers to plan are refused: mem_fraction" in err
    code, _, err = plan("--gpus", "1", "--gpu-memory", "80", "--set", "model_path=org/m")
    assert code == 2 and "model_path 'org/m' is not a local model directory" in err
    code, _, err = plan("--url", "http://127.0.0.1:1", "--set", "tp_size=2")
    assert code == 2 and "--set and --file plan a lever set offline" in err
