"""Figures of the evaluations (``ragpic eval``, ``eval needle``, ``bench``), from their result dicts.

Drawn on ``matplotlib.figure.Figure`` objects: no pyplot, so no global backend choice and
no figure registry in the caller's process.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_bench", "plot_eval", "plot_heatmaps", "plot_pareto"]


def plot_eval(report: dict, path: str | Path) -> Path:
    """Bars: teacher-forced KL and top-1 vs ``full`` per method, with bootstrap 95% intervals."""
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry

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
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry

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
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry

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


def plot_pareto(eval_report: dict | None, needle_result: dict | None, path: str | Path) -> Path:
    """Fidelity vs speed-up, one point per method: MuSiQue TF KL (with its 95% interval) and/or
    needle hits where ``full`` hits, against ``full``'s link time / the method's (log x).

    ``eval_report``: ``ragpic eval --json``'s dict; ``needle_result``: ``ragpic eval needle --json``'s.
    """
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry

    panels = [p for p in (eval_report, needle_result) if p is not None]
    if not panels:
        raise ValueError("plot_pareto needs an eval report, a needle result, or both")
    fig = Figure(figsize=(6 * len(panels), 4.4))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, data in zip(axes, panels):
        if data is eval_report:
            rows = {m: (a["ttft_ratio_vs_full"], a["tf_kl_vs_full"], a.get("tf_kl_vs_full_ci95"))
                    for m, a in data["methods"].items()}
            ax.set_ylabel("MuSiQue teacher-forced KL vs full (lower is better)")
            ax.set_title(f"QA fidelity, {data['config'].get('questions', '?')} questions", fontsize=10)
        else:
            rows = {m: (s["ttft_ratio_vs_full"], s["hits_where_full_hits"], None)
                    for m, s in data["summary"].items()}
            cells = next(iter(data["summary"].values()))["full_hit_cells"]
            ax.set_ylabel(f"needle hits where full hits (of {cells}, higher is better)")
            ax.set_title("needle in a haystack, 1k-6k tokens", fontsize=10)
        for i, (m, (x, y, ci)) in enumerate(rows.items()):
            err = None if ci is None else [[y - ci[0]], [ci[1] - y]]
            ax.errorbar([x], [y], yerr=err, fmt="o", color=f"C{i}", capsize=3)
            ax.annotate(m, (x, y), textcoords="offset points", xytext=(5, 4 if i % 2 else -10), fontsize=8)
        # the speed bar a method had to reach: a link 10x faster than full (docs/RESULTS.md §9)
        ax.axvline(10, ls="--", color="grey", alpha=0.6, lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("speed-up of the link vs full (median, x)")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle("ragpic methods: fidelity vs speed (up and right / down and right is better)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def fidelity_points(needle: dict | None = None, musique: dict | None = None,
                    ruler: dict | None = None) -> dict[str, dict[str, tuple[float, float, list | None]]]:
    """Each evaluation's ``method -> (speed-up vs full, accuracy ratio to full, its 95% CI or None)``.

    The ratios (docs/RESULTS.md §14): needle, hits in the cells ``full`` hits / those cells;
    MuSiQue, the share of questions whose greedy answer equals ``full``'s (normalised); RULER,
    the mean task score / ``full``'s, with its paired bootstrap interval.
    """
    out: dict[str, dict[str, tuple[float, float, list | None]]] = {}
    if needle:
        out["needle"] = {m: (s["ttft_ratio_vs_full"], s["hits_where_full_hits"] / max(1, s["full_hit_cells"]), None)
                         for m, s in needle["summary"].items()}
    if musique:
        out["MuSiQue"] = {m: (a["ttft_ratio_vs_full"], _same_as_full(musique, m), None) for m, a in musique["methods"].items()}
    if ruler:
        out["RULER"] = {m: (a["ttft_ratio_vs_full"], a["score_ratio_vs_full"], a.get("score_ratio_vs_full_ci95"))
                        for m, a in ruler["overall"].items()}
    return out


def _same_as_full(report: dict, method: str) -> float:
    """A ``ragpic eval`` report's answer identity with ``full`` for ``method``; runs made before
    the report carried it get it from their per-question answers, by the same rule."""
    summary = report["methods"][method]
    if "same_as_full" in summary:
        return summary["same_as_full"]
    from ragpic.eval.scoring import exact_match, mean

    return mean([exact_match(q["methods"][method]["answer"], q["methods"]["full"]["answer"])
                 for q in report["questions"]])


def plot_fidelity(model: str, points: dict[str, dict[str, tuple[float, float, list | None]]],
                  path: str | Path) -> Path:
    """One model's figure: accuracy ratio to ``full`` against link speed-up (log x), a marker per
    evaluation, a colour per method (:func:`fidelity_points` gives ``points``)."""
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry

    if not points:
        raise ValueError("plot_fidelity needs at least one evaluation's points")
    methods = list(dict.fromkeys(m for pts in points.values() for m in pts))
    fig = Figure(figsize=(7, 4.6))
    ax = fig.subplots()
    for marker, (name, pts) in zip("osD^v", points.items()):
        for m, (x, y, ci) in pts.items():
            err = None if ci is None else [[max(0.0, y - ci[0])], [max(0.0, ci[1] - y)]]
            ax.errorbar([x], [y], yerr=err, fmt=marker, color=f"C{methods.index(m)}", capsize=3, ms=6)
    # the legend: a colour per method, a marker per evaluation (proxies: the points carry neither alone)
    proxies = [ax.plot([], [], "-", lw=5, color=f"C{i}")[0] for i in range(len(methods))]
    proxies += [ax.plot([], [], mk, color="grey")[0] for mk, _ in zip("osD^v", points)]
    ax.legend(proxies, [*methods, *points], fontsize=7, loc="lower left")
    ax.axhline(0.97, ls=":", color="grey", lw=1)  # the fidelity bar (97% of full)
    ax.axvline(10, ls="--", color="grey", alpha=0.6, lw=1)  # the speed bar (10x at 4k)
    ax.set_xscale("log")
    ax.set_ylim(0, 1.08)
    ax.set_xlabel("speed-up of the link vs full (median, x)")
    ax.set_ylabel("accuracy ratio to full")
    ax.set_title(f"{model}: fidelity vs speed (up and right is better)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path
