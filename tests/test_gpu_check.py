"""scripts/gpu_check.sh runs in CI: without CUDA it says so and exits 0; its CPU dry run
(``RAGPIC_GPU_CHECK_DEVICE=cpu``) runs its steps and its summary for real, with the two slow
steps (the device tests, the bench) stood in for by a recording interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.sh"

# Stands in for $PYTHON: records each call and the environment it got, answers the device
# tests' pytest call and the bench heredoc from prepared files, and hands the summary heredoc
# to the real interpreter.
FAKE_PYTHON = r"""#!/usr/bin/env bash
echo "call: $*" >> "$FAKE_LOG"
if [ "$1" = -m ] && [ "$2" = pytest ]; then
  echo "pytest env: RAGPIC_TEST_DEVICE=${RAGPIC_TEST_DEVICE:-} RAGPIC_GPU_REPORT=$RAGPIC_GPU_REPORT" >> "$FAKE_LOG"
  for a in "$@"; do case $a in --junitxml=*) cp "$FAKE_DIR/junit.xml" "${a#--junitxml=}";; esac; done
  cat "$FAKE_DIR/report.jsonl" >> "$RAGPIC_GPU_REPORT"
  exit 0
fi
script=$(cat)
case $script in
  *run_bench*)
    echo "bench env: GPU_CHECK_DEVICE=$GPU_CHECK_DEVICE GPU_CHECK_CONTEXTS=$GPU_CHECK_CONTEXTS" >> "$FAKE_LOG"
    if [ -f "$FAKE_DIR/bench.json" ]; then cp "$FAKE_DIR/bench.json" "$GPU_CHECK_LOGS/bench.json"; fi
    exit 0;;
  *) exec "$REAL_PYTHON" "$@" <<< "$script";;
esac
"""

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3" failures="{f}"
 errors="0" skipped="1"><testcase name="test_a"/><testcase name="test_b">{failure}</testcase>
<testcase name="test_c"><skipped/></testcase></testsuite></testsuites>"""


def _dry_run(tmp_path: Path, *, report_rows: list[dict], failed_test: bool = False, bench: bool = True):
    fake = tmp_path / "fake"
    fake.mkdir(parents=True)
    py = fake / "python"
    py.write_text(FAKE_PYTHON)
    py.chmod(0o755)
    (fake / "junit.xml").write_text(JUNIT.format(f=int(failed_test), failure="<failure/>" if failed_test else ""))
    (fake / "report.jsonl").write_text("".join(json.dumps(r) + "\n" for r in report_rows))
    if bench:
        run = {"context_tokens": 256, "method": "legolink-16", "ttft_median_s": 0.0125, "ratio_vs_full": 3.5,
               "flop_limit_ratio": 4.0, "peak_mem_mb": 12.0}
        (fake / "bench.json").write_text(json.dumps({"model": "m", "dtype": "torch.float32",
                                                     "runs": {"default bands": [run]}}))
    logs = tmp_path / "logs"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGPIC_GPU_CHECK")}
    env.update(PYTHON=str(py), REAL_PYTHON=sys.executable, FAKE_DIR=str(fake), FAKE_LOG=str(tmp_path / "calls"),
               RAGPIC_GPU_CHECK_DEVICE="cpu", RAGPIC_GPU_CHECK_OUT=str(logs), RAGPIC_GPU_CHECK_CONTEXTS="256,512")
    env.pop("RAGPIC_TEST_DEVICE", None)
    out = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    return out, (tmp_path / "calls").read_text(), logs


def test_gpu_check_is_executable_and_its_dry_run_passes_on_good_results(tmp_path):
    assert os.access(SCRIPT, os.X_OK)
    rows = [{"check": "int8 on device", "case": "dequantize", "result": "ok", "detail": "d"}]
    out, calls, logs = _dry_run(tmp_path, report_rows=rows)
    assert out.returncode == 0, out.stdout + out.stderr
    # the device tests ran on the CPU, writing their rows where the summary reads them
    assert "call: -m pytest -q -m cuda tests/core/test_cuda.py" in calls
    assert f"pytest env: RAGPIC_TEST_DEVICE=cpu RAGPIC_GPU_REPORT={logs / 'report.jsonl'}" in calls
    assert "bench env: GPU_CHECK_DEVICE=cpu GPU_CHECK_CONTEXTS=256,512" in calls
    summary = out.stdout[out.stdout.index("gpu_check summary: CPU (dry run)"):]
    assert "int8 on device" in summary and "pytest -m cuda" in summary and "2 passed, 1 skipped, 0 failed" in summary
    assert "bench default bands  256 legolink-16  12.5 ms" in summary
    assert summary.rstrip().endswith("all checks passed")


def test_gpu_check_dry_run_fails_on_a_failed_check_test_or_missing_bench(tmp_path):
    rows = [{"check": "slab pool", "case": "cuda", "result": "FAIL", "detail": "not reused"}]
    out, _, _ = _dry_run(tmp_path / "row", report_rows=rows)
    assert out.returncode == 1 and out.stdout.rstrip().endswith("1 failed"), out.stdout + out.stderr
    out, _, _ = _dry_run(tmp_path / "test", report_rows=[], failed_test=True)
    assert out.returncode == 1 and "1 failed test_b" in out.stdout, out.stdout + out.stderr
    out, _, _ = _dry_run(tmp_path / "bench", report_rows=[], bench=False)
    assert out.returncode == 1 and "no bench.json: see bench.log" in out.stdout, out.stdout + out.stderr


def test_gpu_check_without_cuda_says_so_and_exits_0():
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGPIC_GPU_CHECK")}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHON=sys.executable)  # no GPU visible, wherever this runs
    out = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "gpu_check: no CUDA device here" in out.stdout and "skipped" in out.stdout
