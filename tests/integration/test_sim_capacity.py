"""The simulated server sizes and resolves as SGLang 0.5.23 does — checked against numbers
computed here from SGLang's formulas, not from the planner the simulator calls (so halving
the planner's KV formula fails these tests).

Sources (SGLang 0.5.23, ``sglang/srt/``): ``arg_groups/memory_hook.py:291-328`` (the
reserve), ``model_executor/pool_configurator.py:491-497`` (MHA cell), ``:786-803`` (SWA
cell), ``mem_cache/kv_cache_configurator.py:3115-3135`` (default max_running_requests),
``mem_cache/hicache_auto_size.py:82-125`` (auto-sizing), ``arg_groups/parallel_hook.py``
(attention DP), ``mem_cache/kv_cache_configurator.py:3007`` (the slack outside the static
pool), ``arg_groups/serving_hook.py:222-234`` and
``managers/data_parallel_controller.py:880-899`` (round robin over the DP workers).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_sim_server import TOTAL_BYTES, TOTAL_MIB, Sims, sims, wait_until

__all__ = ["sims"]

GiB = 1 << 30
#: The built-in simulated model: Llama-3.1-70B (80 layers, 8 KV heads of 128), 141.2e9 B.
LLAMA_WEIGHTS = 141_200_000_000
#: TP8 defaults on an H200: 512 + 8192 × 1.5 + 8 / 8 × 1024 + 512 × 2 + 58 prefill graph
#: sizes × 8 = 15312 MiB reserved.
TP8_FRACTION = round((TOTAL_MIB - 15312) / TOTAL_MIB, 3)


def _tokens(fraction: float, weights_per_rank: float, cell: float) -> int:
    return int((fraction * TOTAL_BYTES - weights_per_rank) // cell)


def _default_running(tokens: int, context_len: int = 131072) -> int:
    return min(max(min(int(tokens / context_len * 512), 4096), 2048), tokens // 2)


def test_pool_and_running_requests_follow_sglangs_formulas(sims: Sims) -> None:
    sim = sims.start(tp=8)
    sim.wait_ready()
    info = sim.get_json("/server_info")
    cell = 1 * (128 + 128) * 2 * 80  # 8 KV heads / TP 8, K and V, bf16, 80 layers
    tokens = _tokens(TP8_FRACTION, LLAMA_WEIGHTS / 8, cell)
    assert TP8_FRACTION == 0.893
    assert info["mem_fraction_static"] == TP8_FRACTION
    assert info["max_total_num_tokens"] == tokens
    assert info["max_running_requests"] == _default_running(tokens)
    assert info["chunked_prefill_size"] == 8192


def test_attention_dp_in_the_deprecated_spelling_resolves_like_sglang(sims: Sims) -> None:
    sim = sims.start("--dp-size", "8", "--enable-dp-attention", tp=8)
    sim.wait_ready()
    info = sim.get_json("/server_info")
    assert (info["attn_dp_size"], info["chunked_prefill_size"]) == (8, 1024)
    assert info["schedule_conservativeness"] == 0.3
    # 8 ranks on 8 GPUs, one each (not 64).
    assert all(mib > 0 for mib in sims.used_mib())
    # 15312 + 512 × 8 × 3 + 512 × 8 × 1.5 = 33744 MiB reserved.
    assert info["mem_fraction_static"] == round((TOTAL_MIB - 33744) / TOTAL_MIB, 3)


def test_sliding_window_model_sizes_its_pool_with_the_swa_cell(sims: Sims, tmp_path: Path) -> None:
    model = tmp_path / "gpt-oss-120b"
    model.mkdir()
    layers = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(36)]
    config = {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "num_hidden_layers": 36,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "sliding_window": 128,
        "layer_types": layers,
        "max_position_embeddings": 131072,
    }
    weights = 65_248_815_744
    (model / "config.json").write_text(json.dumps(config))
    index = {"metadata": {"total_size": weights}, "weight_map": {}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    sim = sims.start("--model-path", str(model), tp=8)
    sim.wait_ready()
    info = sim.get_json("/server_info")
    cell = 256 * 18 + 0.8 * 256 * 18  # 8294.4 B: full layers + 0.8 × sliding layers
    assert info["max_total_num_tokens"] == _tokens(TP8_FRACTION, weights // 8, cell)


#: TP8 defaults: what is spent outside the static pool before the first prefill: 512
#: metadata + 8 / 8 × 1024 parallel + 512 × 2 decode graphs + 58 × 8 prefill graphs.
TP8_FIXED_MIB = 512 + 1024 + 1024 + 58 * 8


def _prefill_limit(fraction: float) -> int:
    """Prompt tokens whose activations (1.5 MiB each, memory_hook.py:310) fit what the
    fraction leaves after the fixed part, with SGLang's rounding half step."""
    return int(((1 - fraction) * TOTAL_MIB - TP8_FIXED_MIB + 0.0005 * TOTAL_MIB) / 1.5)


def test_cuda_graph_capture_fails_when_the_fraction_leaves_too_little(sims: Sims) -> None:
    sim = sims.start("--mem-fraction-static", "0.985", tp=8)
    assert sim.exited(20) == 1
    log = sim.log_text()
    assert "Capture cuda graph failed: CUDA out of memory" in log
    assert "--mem-fraction-static to a smaller value (e.g., 0.893" in log
    wait_until(lambda: sims.used_mib() == [0] * 8, 10, "memory freed")


def test_hicache_without_size_or_ratio_is_auto_sized(sims: Sims) -> None:
    sim = sims.start("--enable-hierarchical-cache", tp=8, env={"SGLANG_SIM_HOST_RAM_GIB": "500"})
    sim.wait_ready()
    info = sim.get_json("/server_info")
    tokens = info["max_total_num_tokens"]
    device = tokens * 40960
    budget = int((500 * GiB - 10 * GiB) // 8 * 0.8)
    ratio = min(2.0, budget * 0.95 / device)
    assert info["hicache_ratio"] == round(ratio, 3)
    assert ratio < 2.0
    assert f"HiCache auto-sizing: ratio 2.000 -> {ratio:.3f}" in sim.log_text()


def test_a_prefill_larger_than_the_fraction_leaves_crashes_the_server(sims: Sims) -> None:
    # 0.97 passes capture (4313 MiB outside the pool > 3024) but leaves 907 tokens of
    # activations: a short prompt is served, a longer one runs out of memory.
    limit = _prefill_limit(0.97)
    assert limit == 907
    sim = sims.start("--mem-fraction-static", "0.97", tp=8)
    sim.wait_ready()
    assert sim.generate("x" * 4 * 800, 2).status_code == 200
    with contextlib.suppress(httpx.TransportError):  # the server dies under the request
        sim.generate("y" * 4 * 2000, 2)
    assert sim.exited(15) == 1
    log = sim.log_text()
    assert "torch.OutOfMemoryError: CUDA out of memory." in log
    assert "a prefill of 2000 tokens needs 2.93 GiB" in log
    assert f"room for {limit} after the CUDA graphs" in log
    wait_until(lambda: sims.used_mib() == [0] * 8, 10, "memory freed")


def test_at_sglangs_default_fraction_a_full_chunk_prefills(sims: Sims) -> None:
    # The default leaves exactly SGLang's reserve: 8192 × 1.5 MiB of activations fit, and a
    # longer prompt is chunked (8192 tokens per forward).
    assert _prefill_limit(TP8_FRACTION) >= 8192
    sim = sims.start(tp=8)
    sim.wait_ready()
    assert sim.generate("z" * 4 * 30000, 1).status_code == 200
    assert sim.proc.poll() is None


def test_attention_dp_runs_one_pool_per_worker(sims: Sims) -> None:
    # 8 DP workers, each its own pool and 1/8 of max_running_requests; requests go round
    # robin, so 16 requests run as 2 per worker, each worker exporting its own series.
    sim = sims.start(
        "--attn-dp-size", "8", "--max-running-requests", "16", tp=8,
        env={"SGLANG_SIM_LOAD": "rate=200,avg_tokens=2000,out_tokens=1000,seed=2"},
    )  # fmt: skip
    sim.wait_ready()
    info = sim.get_json("/server_info")
    assert info["max_running_requests"] == 16
    assert [s["max_running_requests"] for s in info["internal_states"]] == [2] * 8

    def per_worker() -> dict[str, tuple[float, float]] | None:
        text = httpx.get(sim.url("/metrics"), timeout=5).text
        out: dict[str, list[float]] = {}
        for fam in text_string_to_metric_families(text):
            for sample in fam.samples:
                if sample.name in ("sglang:num_running_reqs", "sglang:num_queue_reqs"):
                    out.setdefault(sample.labels["dp_rank"], []).append(sample.value)
        full = {k: (v[0], v[1]) for k, v in out.items()}
        return full if full and all(r == 2 and q > 0 for r, q in full.values()) else None

    workers = wait_until(per_worker, 15, "2 running and a queue on every DP worker")
    assert sorted(workers) == [str(i) for i in range(8)]
    assert "DP7 TP7" in sim.log_text()
