"""Figures of the evaluations (``ragpic eval``, ``eval needle``, ``bench``), from their result dicts:
what each command's ``--plot`` draws. The research figures drawn from several runs' JSON
(fidelity vs speed-up) are the benchmarks' (``benchmarks/plots.py``).

Drawn on ``matplotlib.figure.Figure`` objects: no pyplot, so no global backend choice and
no figure registry in the caller's process. matplotlib is optional (the ``notebooks`` extra):
importing this module never needs it; drawing without it raises an ImportError that says
what to install.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_bench", "plot_eval", "plot_heatmaps"]


def _figure_class(what: str):
    """``matplotlib.figure.Figure``; without matplotlib, an ImportError naming the pip extra that has it."""
    try:
        from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "matplotlib":
            raise  # matplotlib is there but one of its own imports is not: its error says which
        raise ImportError(f"{what} draws with matplotlib, which is not installed: "
                          "pip install 'ragpic[notebooks]'", name="matplotlib") from exc
    return Figure


def plot_eval(report: dict, path: str | Path) -> Path:
    """Bars: teacher-forced KL and top-1 vs ``full`` per method, with bootstrap 95% intervals."""
    Figure = _figure_class("plot_eval (ragpic eval --plot)")

    methods = [m for m in report["methods"] if m != "full"]
    aggs = [report["methods"][m] for m in methods]
    fig = Figure(figsize=(11, 3.8))
    axes = fig.subplots(1, 2)
    for ax, key, title in ((axes[0], "tf_kl_vs_full", "teacher-forced KL(full || method)  (lower is better)"),
                           (axes[1], "tf_top1_vs_full", "teacher-forced top-1 agreement with full")):
        vals = [a[key] for a in aggs]
        ci = [a.get(f"{key}_ci95") or [v, v] for a, v in zip(aggs, vals)]
        err = [[v - c[0] for v, c in zip(vals, ci)], [c[1] - v for v, c in zip(vals, ci)]]
        ax.bar(methods, vals, yerr=err, capsize=4, color=[f"C{i + 1}" for i in range(len(methods))])
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    cfg = report.get("config", {})
    fig.suptitle(f"ragpic eval: {cfg.get('questions', '?')} questions, {cfg.get('model', '')} "
                 f"(bars: 95% bootstrap interval over questions)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def plot_heatmaps(result: dict, path: str | Path) -> list[Path]:
    """One figure with an F1 heat map (depth x length) per method, plus one PNG per method."""
    import numpy as np

    Figure = _figure_class("plot_heatmaps (ragpic eval needle --plot)")

    lengths, depths = result["config"]["lengths"], result["config"]["depths"]
    methods = list(result["summary"])
    by = {(c["method"], c["length"], c["depth"]): c for c in result["cells"]}

    def grid(m):
        f1 = np.full((len(depths), len(lengths)), np.nan)
        hit = np.zeros_like(f1, dtype=bool)
        for i, d in enumerate(depths):
            for j, L in enumerate(lengths):
                c = by.get((m, L, d))
                if c:
                    f1[i, j], hit[i, j] = c["f1"], c["hit"]
        return f1, hit

    def draw(ax, m):
        f1, hit = grid(m)
        im = ax.imshow(f1, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(lengths)), [str(L) for L in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
        ax.set_xlabel("context tokens", fontsize=8)
        ax.set_ylabel("needle depth", fontsize=8)
        s = result["summary"][m]
        ax.set_title(f"{m}: {s['hits']}/{s['cells']} hits", fontsize=9)
        for i in range(len(depths)):
            for j in range(len(lengths)):
                if not np.isnan(f1[i, j]):
                    ax.text(j, i, ("\u2713 " if hit[i, j] else "") + f"{f1[i, j]:.2f}", ha="center",
                            va="center", fontsize=6)
        return im

    path = Path(path)
    cols = min(3, len(methods))
    rows = (len(methods) + cols - 1) // cols
    fig = Figure(figsize=(4.4 * cols, 3.6 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, m in zip(axes.flat, methods):
        im = draw(ax, m)
    for ax in list(axes.flat)[len(methods):]:
        ax.axis("off")
    fig.colorbar(im, ax=axes, shrink=0.6, label="F1 vs needle")
    fig.suptitle(f"Needle in a haystack ({result['config']['model']}): F1 vs needle, "
                 "\u2713 = names sandwich + Dolores Park")
    fig.savefig(path, dpi=110)
    written = [path]
    for m in methods:
        fig = Figure(figsize=(4.8, 3.6), layout="constrained")
        ax = fig.subplots()
        fig.colorbar(draw(ax, m), ax=ax, label="F1 vs needle")
        p = path.with_name(f"{path.stem}-{m}{path.suffix}")
        fig.savefig(p, dpi=110)
        written.append(p)
    return written


def plot_bench(result: dict, path: str | Path) -> Path:
    """TTFT, speed-up (with FLOP limits dashed) and peak link memory vs context length."""
    Figure = _figure_class("plot_bench (ragpic bench --plot)")

    methods = result["config"]["methods"]
    fig = Figure(figsize=(15, 4.2))
    axes = fig.subplots(1, 3)
    for i, m in enumerate(methods):
        rs = [r for r in result["rows"] if r["method"] == m]
        x = [r["context_tokens"] for r in rs]
        color = f"C{i}"
        axes[0].plot(x, [r["ttft_median_s"] for r in rs], "o-", color=color, label=m)
        if m != "full":
            axes[1].plot(x, [r["ratio_vs_full"] for r in rs], "o-", color=color, label=f"{m} measured")
            axes[1].plot(x, [r["flop_limit_ratio"] for r in rs], "--", color=color, alpha=0.6)
        axes[2].plot(x, [r["peak_mem_mb"] for r in rs], "o-", color=color, label=m)
    for ax, title, ylabel in ((axes[0], "link TTFT (median)", "seconds"),
                              (axes[1], "speed-up vs full (dashed: FLOP limit)", "x faster than full"),
                              (axes[2], "peak memory of the link step", "MiB")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context tokens")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=7)
    cfg = result["config"]
    fig.suptitle(f"ragpic bench: {cfg['model']} on {cfg['device']} ({cfg['dtype']}, {cfg['torch_threads']} threads), "
                 f"{cfg['chunk_tokens']}-token chunks, {cfg['query_tokens']}-token query")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path
