"""Lever sets SGLang 0.5.23 refuses at launch, and production sets it accepts.

Every bad set is refused by SGLang's *own* code; the expected ``where`` is the
``file:line in function`` of SGLang 0.5.23 that raises it (read from the installed
package: ``sglang/srt/arg_groups/...``), and the test checks that it is exactly where
SGLang raised. The model directories are ``tests/data/models`` (config.json only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
LLAMA_8B = str(MODELS / "llama-3.1-8b")
LLAMA_70B = str(MODELS / "llama-3.1-70b")
DEEPSEEK_V3 = str(MODELS / "deepseek-v3")
QWEN_7B = str(MODELS / "qwen2.5-7b")

L8: dict[str, Any] = {"model_path": LLAMA_8B}
DS: dict[str, Any] = {"model_path": DEEPSEEK_V3, "tp_size": 8}

AG = "sglang/srt/arg_groups/"
VH = AG + "validation_hook.py"


class Bad(NamedTuple):
    name: str
    levers: dict[str, Any]
    #: Where SGLang 0.5.23 raises it.
    where: str
    #: A piece of SGLang's own message.
    says: str
    #: The lever the refusal must name: the one SGLang's rule is about (its message, the
    #: statement that raised it and the conditions around it: parser.refusal_levers).
    lever: str


BAD: list[Bad] = [
    Bad(
        "hicache_with_radix_cache_off",
        {**L8, "enable_hierarchical_cache": True, "disable_radix_cache": True},
        AG + "kv_cache_hook.py:394 in handle_cache_compatibility",
        "mutually exclusive",
        "enable_hierarchical_cache",
    ),
    Bad(
        "hicache_host_memory_fraction_above_1",
        {**L8, "enable_hierarchical_cache": True, "hicache_host_memory_fraction": 1.5},
        AG + "hicache_hook.py:117 in handle_hicache_ratio_default",
        "must be in (0, 1]",
        "hicache_host_memory_fraction",
    ),
    Bad(
        "nvfp4_kv_on_hopper",
        {**L8, "kv_cache_dtype": "nvfp4"},
        AG + "kv_cache_hook.py:128 in handle_kv4_compatibility",
        "requires Blackwell",
        "kv_cache_dtype",
    ),
    Bad(
        "mxfp8_kv_on_hopper",
        {**L8, "kv_cache_dtype": "mxfp8"},
        AG + "kv_cache_hook.py:106 in handle_mxfp8_kv_cache_compatibility",
        "SM100+",
        "kv_cache_dtype",
    ),
    Bad(
        "trtllm_mla_on_hopper",
        {**DS, "attention_backend": "trtllm_mla"},
        AG + "overrides.py:1211 in _mla_kv_cache_dtype_checks",
        "only supported on Blackwell",
        "attention_backend",
    ),
    Bad(
        "served_model_name_with_colon",
        {**L8, "served_model_name": "llama:v2"},
        VH + ":215 in check_server_args",
        "cannot contain a colon",
        "served_model_name",
    ),
    Bad(
        "dp_replicas_with_attention_dp",
        {**L8, "tp_size": 4, "dp_size": 2, "attn_dp_size": 2},
        AG + "parallel_hook.py:288 in handle_data_parallelism",
        "not supported",
        "dp_size",
    ),
    Bad(
        "tp_not_divisible_by_attention_dp",
        {**DS, "attn_dp_size": 3},
        AG + "parallel_hook.py:326 in handle_data_parallelism",
        "AssertionError",
        "attn_dp_size",
    ),
    Bad(
        "moe_dense_tp_not_1_or_tp",
        {**L8, "tp_size": 8, "moe_dense_tp_size": 2},
        VH + ":207 in check_server_args",
        "moe_dense_tp_size only supports",
        "moe_dense_tp_size",
    ),
    Bad(
        "no_tokenizer_worker",
        {**L8, "tokenizer_worker_num": 0},
        VH + ":273 in check_server_args",
        "Tokenizer worker num",
        "tokenizer_worker_num",
    ),
    Bad(
        "no_detokenizer_worker",
        {**L8, "detokenizer_worker_num": 0},
        VH + ":274 in check_server_args",
        "Detokenizer worker num",
        "detokenizer_worker_num",
    ),
    # Existing files: a path that names nothing is refused before SGLang (lever_paths).
    Bad(
        "ssl_key_without_cert",
        {**L8, "ssl_keyfile": "/etc/passwd"},
        AG + "serving_hook.py:51 in handle_ssl_validation",
        "requires --ssl-certfile",
        "ssl_keyfile",
    ),
    Bad(
        "ssl_cert_without_key",
        {**L8, "ssl_certfile": "/etc/passwd"},
        AG + "serving_hook.py:55 in handle_ssl_validation",
        "requires --ssl-keyfile",
        "ssl_certfile",
    ),
    Bad(
        "ssl_ca_without_cert",
        {**L8, "ssl_ca_certs": "/etc/passwd"},
        AG + "serving_hook.py:60 in handle_ssl_validation",
        "has no effect",
        "ssl_ca_certs",
    ),
    Bad(
        "ssl_refresh_without_cert",
        {**L8, "enable_ssl_refresh": True},
        AG + "serving_hook.py:84 in handle_ssl_validation",
        "--enable-ssl-refresh requires",
        "enable_ssl_refresh",
    ),
    Bad(
        "reuseport_with_one_tokenizer",
        {**L8, "enable_http_worker_reuseport": True},
        AG + "serving_hook.py:91 in handle_ssl_validation",
        "--tokenizer-worker-num > 1",
        "enable_http_worker_reuseport",
    ),
    Bad(
        "watermark_config_without_watermark",
        {**L8, "watermark_config": "{}"},
        VH + ":37 in check_watermark_server_args",
        "requires --enable-watermark",
        "watermark_config",
    ),
    Bad(
        "watermark_with_custom_logit_processor",
        {**L8, "enable_watermark": True, "enable_custom_logit_processor": True},
        VH + ":75 in check_watermark_server_args",
        "incompatible",
        "enable_watermark",
    ),
    Bad(
        "priority_scheduling_with_lpm",
        {**L8, "enable_priority_scheduling": True, "schedule_policy": "lpm"},
        VH + ":282 in check_server_args",
        "must be 'fcfs' or 'lof'",
        "schedule_policy",
    ),
    Bad(
        "no_graph_padding_with_torch_compile",
        {**L8, "disable_cuda_graph_padding": True, "enable_torch_compile": True},
        VH + ":188 in check_server_args",
        "incompatible with --enable-torch-compile",
        "disable_cuda_graph_padding",
    ),
    Bad(
        "pdmux_with_pipeline_parallel",
        {**L8, "enable_pdmux": True, "pp_size": 2},
        VH + ":250 in check_server_args",
        "pipeline parallelism disabled",
        "pp_size",
    ),
    Bad(
        "lora_batch_above_loaded",
        {
            **L8,
            "enable_lora": True,
            "max_loras_per_batch": 4,
            "max_loaded_loras": 2,
            "max_lora_rank": 16,
            "lora_target_modules": ["all"],
        },
        AG + "lora_hook.py:158 in check_lora_server_args",
        "max_loaded_loras should be greater",
        "max_loaded_loras",
    ),
    Bad(
        "lora_without_paths_or_rank",
        {**L8, "enable_lora": True},
        AG + "lora_hook.py:152 in check_lora_server_args",
        "--max-lora-rank and --lora-target-modules",
        "lora_paths",
    ),
    Bad(
        "lora_zero_per_batch",
        {
            **L8,
            "enable_lora": True,
            "max_loras_per_batch": 0,
            "max_lora_rank": 16,
            "lora_target_modules": ["all"],
        },
        AG + "lora_hook.py:36 in check_lora_server_args",
        "must be positive",
        "max_loras_per_batch",
    ),
    Bad(
        "chunk_not_multiple_of_page",
        {**L8, "chunked_prefill_size": 1000, "page_size": 64},
        VH + ":244 in check_server_args",
        "divisible by page_size",
        "chunked_prefill_size",
    ),
    Bad(
        "pp_micro_batch_zero",
        {**L8, "pp_max_micro_batch_size": 0},
        VH + ":183 in check_server_args",
        "pp_max_micro_batch_size must be a positive",
        "pp_max_micro_batch_size",
    ),
    Bad(
        "hicache_buffer_only_without_storage",
        {**L8, "enable_hierarchical_cache": True, "hicache_host_memory_mode": "buffer_only"},
        AG + "hicache_hook.py:273 in validate_hicache_host_memory_mode",
        "requires a storage backend",
        "hicache_host_memory_mode",
    ),
    Bad(
        "decode_host_receive_threshold_above_1",
        {**L8, "disaggregation_decode_host_receive_threshold": 2},
        AG + "pd_disaggregation_hook.py:65 in handle_pd_disaggregation",
        "must be between 0 and 1",
        "disaggregation_decode_host_receive_threshold",
    ),
    Bad(
        "prefill_with_fake_transfer",
        {**L8, "disaggregation_mode": "prefill", "disaggregation_transfer_backend": "fake"},
        AG + "pd_disaggregation_hook.py:146 in handle_pd_disaggregation",
        "does not support 'fake'",
        "disaggregation_transfer_backend",
    ),
    Bad(
        "tp_not_divisible_by_attention_cp",
        {**L8, "tp_size": 8, "attn_cp_size": 3},
        AG + "parallel_hook.py:159 in handle_context_parallelism",
        "divisible by attn_cp_size",
        "attn_cp_size",
    ),
    Bad(
        "prefill_kv_dequant_without_nvfp4",
        {**L8, "prefill_kv_cache_dequant_dtype": "fp8_e4m3"},
        AG + "kv_cache_hook.py:41 in handle_nvfp4_prefill_kv_dequant_dtype",
        "applies only with --kv-cache-dtype=nvfp4",
        "prefill_kv_cache_dequant_dtype",
    ),
    Bad(
        "negative_prefill_graph_context",
        {**L8, "cuda_graph_prefill_max_context": -5},
        AG + "cuda_graph_hook.py:427 in _resolve_max_context_size",
        "must be a positive integer",
        "cuda_graph_prefill_max_context",
    ),
    Bad(
        "negative_mm_processor_workers",
        {**L8, "mm_processor_worker_num": -1},
        VH + ":275 in check_server_args",
        "Multimodal processor worker num",
        "mm_processor_worker_num",
    ),
    Bad(
        "speculative_window_zero",
        {**L8, "speculative_algorithm": "EAGLE", "speculative_draft_window_size": 0},
        AG + "speculative_hook.py:205 in handle_speculative_decoding",
        "must be positive",
        "speculative_draft_window_size",
    ),
    Bad(
        "cutedsl_moe_without_fp4",
        {**DS, "moe_runner_backend": "flashinfer_cutedsl"},
        AG + "moe_hook.py:98 in handle_moe_kernel_config",
        "FlashInfer CuteDSL MOE currently supports only",
        "moe_runner_backend",
    ),
    Bad(
        "linker_dedup_without_mooncake",
        {**L8, "enable_linker_mla_dedup": True},
        AG + "hicache_hook.py:43 in handle_hicache",
        "requires the Mooncake linker",
        "enable_linker_mla_dedup",
    ),
    Bad(
        "external_linker_with_radix_off",
        {**L8, "enable_unified_cache_external_linker": True, "disable_radix_cache": True},
        AG + "hicache_hook.py:46 in handle_hicache",
        "radix caching enabled",
        "enable_unified_cache_external_linker",
    ),
    Bad(
        "lmcache_with_speculative",
        {**L8, "enable_lmcache": True, "speculative_algorithm": "NGRAM"},
        AG + "kv_cache_hook.py:450 in handle_cache_compatibility",
        "does not yet support speculative decoding",
        "speculative_algorithm",
    ),
    Bad(
        "lmcache_with_attention_dp",
        {**L8, "enable_lmcache": True, "tp_size": 8, "attn_dp_size": 8},
        AG + "kv_cache_hook.py:454 in handle_cache_compatibility",
        "does not yet support DP attention",
        "enable_lmcache",
    ),
    # Caught first by the supervisor's own lever limits when they go through the daemon
    # (SGLang's words are quoted there); SGLang's own code refuses them too:
    Bad(
        "negative_base_gpu_id",
        {**L8, "base_gpu_id": -1},
        VH + ":204 in check_server_args",
        "base_gpu_id must be non-negative",
        "base_gpu_id",
    ),
    Bad(
        "zero_gpu_id_step",
        {**L8, "gpu_id_step": 0},
        VH + ":205 in check_server_args",
        "gpu_id_step must be positive",
        "gpu_id_step",
    ),
    Bad(
        "negative_schedule_conservativeness",
        {**L8, "schedule_conservativeness": -1},
        VH + ":314 in check_server_args",
        "must be non-negative",
        "schedule_conservativeness",
    ),
]

#: Names caught by the supervisor's lever limits before SGLang is asked.
CAUGHT_BY_LIMITS = {
    "negative_base_gpu_id",
    "zero_gpu_id_step",
    "negative_schedule_conservativeness",
    # A process count: bounded both ways before SGLang (lever_limits.RANGES), whose own
    # assert has only the lower bound.
    "no_tokenizer_worker",
    "no_detokenizer_worker",
    # Either TLS file makes the server HTTPS-only (or SGLang refuses it): the daemon's
    # plain-HTTP probes could never see it (lever_limits.probe_problems, issue 27 §5).
    "ssl_key_without_cert",
    "ssl_cert_without_key",
}


class Good(NamedTuple):
    name: str
    levers: dict[str, Any]
    #: Values SGLang 0.5.23 resolves for this set on 8 × H200 (143771 MiB, SM 9.0).
    resolved: dict[str, Any]


GOOD: list[Good] = [
    Good(
        # Llama-3.1-70B, TP8, fp8 KV, hierarchical cache: the planner's usual proposal.
        "llama70b_tp8_fp8kv_hicache",
        {
            "model_path": LLAMA_70B,
            "tp_size": 8,
            "kv_cache_dtype": "fp8_e4m3",
            "enable_hierarchical_cache": True,
            "hicache_size": 30,
            "hicache_write_policy": "write_through",
            "mem_fraction_static": 0.9,
            "chunked_prefill_size": 4096,
            "max_running_requests": 256,
        },
        {
            "mem_fraction_static": 0.9,
            "chunked_prefill_size": 4096,
            "max_running_requests": 256,
            "kv_cache_dtype": "fp8_e4m3",
            "enable_hierarchical_cache": True,
            # memory_hook.py:175-182: a decode graph never larger than the running cap.
            "cuda_graph_max_bs": 256,
        },
    ),
    Good(
        # DeepSeek-V3 (fp8 checkpoint), TP8 with attention DP 8.
        "deepseek_v3_tp8_attention_dp",
        {"model_path": DEEPSEEK_V3, "tp_size": 8, "attn_dp_size": 8},
        {"tp_size": 8, "attn_dp_size": 8, "dp_size": 1},
    ),
    Good(
        # The same, spelled the deprecated way (--enable-dp-attention --dp-size 8):
        # parallel_hook.py handle_deprecated_dp_attention moves the width to attn_dp_size.
        "deepseek_v3_tp8_enable_dp_attention",
        {"model_path": DEEPSEEK_V3, "tp_size": 8, "dp_size": 8, "enable_dp_attention": True},
        {"attn_dp_size": 8, "dp_size": 1},
    ),
    Good(
        # Defaults on H200: memory_hook.py:146-159 (gpu_mem < 160 GiB: chunk 8192, decode
        # graph max_bs 512 with tp >= 4) and :324 (the fraction SGLang picks).
        "llama8b_tp8_defaults",
        {"model_path": LLAMA_8B, "tp_size": 8},
        {
            "chunked_prefill_size": 8192,
            "cuda_graph_max_bs": 512,
            "mem_fraction_static": 0.893,
            "page_size": 1,
            "attention_backend": "fa3",
        },
    ),
    Good(
        # tp < 4: decode graph max_bs 256 (memory_hook.py:157).
        "llama8b_tp1_defaults",
        {"model_path": LLAMA_8B},
        {"chunked_prefill_size": 8192, "cuda_graph_max_bs": 256},
    ),
    Good(
        "llama70b_tp8_hicache_ratio_radix_lru",
        {
            "model_path": LLAMA_70B,
            "tp_size": 8,
            "enable_hierarchical_cache": True,
            "hicache_ratio": 2.0,
            "page_size": 64,
            "chunked_prefill_size": 8192,
        },
        {"page_size": 64, "hicache_ratio": 2.0},
    ),
    Good(
        "qwen7b_tp2_fp8kv_chunk4096",
        {
            "model_path": QWEN_7B,
            "tp_size": 2,
            "kv_cache_dtype": "fp8_e4m3",
            "chunked_prefill_size": 4096,
            "schedule_policy": "lpm",
        },
        {"chunked_prefill_size": 4096, "kv_cache_dtype": "fp8_e4m3"},
    ),
    Good(
        "llama70b_tp4_dp2",
        {"model_path": LLAMA_70B, "tp_size": 4, "dp_size": 2},
        {"tp_size": 4, "dp_size": 2},
    ),
]
