"""Reading SGLang 0.5.23's /metrics: totals only, never a total plus its breakdown."""

from __future__ import annotations

import os
from pathlib import Path

from sglang_supervisor.observe.telemetry import parse_metrics, tail_lines

#: What SGLang exports with --enable-priority-scheduling: the total under priority="" and
#: the per-priority breakdown under priority="<n>"
#: (sglang/srt/observability/metrics_collector.py:1417-1430), per DP rank.
PRIORITY_METRICS = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",model_name="m",priority=""} 50.0
sglang:num_running_reqs{dp_rank="0",model_name="m",priority="0"} 30.0
sglang:num_running_reqs{dp_rank="0",model_name="m",priority="5"} 20.0
sglang:num_running_reqs{dp_rank="1",model_name="m",priority=""} 34.0
sglang:num_running_reqs{dp_rank="1",model_name="m",priority="0"} 34.0
# HELP sglang:num_queue_reqs The number of queued requests.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{dp_rank="0",model_name="m",priority=""} 7.0
sglang:num_queue_reqs{dp_rank="0",model_name="m",priority="5"} 7.0
sglang:num_queue_reqs{dp_rank="1",model_name="m",priority=""} 0.0
"""


def test_priority_breakdowns_are_not_added_to_the_totals() -> None:
    t = parse_metrics(PRIORITY_METRICS)
    assert t.running_requests == 84  # 50 + 34 over the DP ranks, not 168
    assert t.queued_requests == 7


def test_without_priority_labels_every_rank_is_summed() -> None:
    text = PRIORITY_METRICS.replace(',priority=""', "").replace("priority=", "p=")
    text = "\n".join(line for line in text.splitlines() if "p=" not in line) + "\n"
    t = parse_metrics(text)
    assert t.running_requests == 84 and t.queued_requests == 7


def test_tail_lines_reads_only_a_regular_file_of_its_own(tmp_path: Path) -> None:
    """A link or a FIFO planted under a launch log's name: the log tail an operation keeps
    (and ``GET /logs``) neither follows the link nor waits for a writer."""
    victim = tmp_path / "victim"
    victim.write_text("secret\n")
    (tmp_path / "server-1.log").symlink_to(victim)
    os.mkfifo(tmp_path / "server-2.log")
    (tmp_path / "server-3.log").write_text("one\ntwo\n")
    assert tail_lines(tmp_path / "server-1.log", 10) == []
    assert tail_lines(tmp_path / "server-2.log", 10) == []
    assert tail_lines(tmp_path / "server-3.log", 1) == ["two"]
