"""The resume-latency plot: latency against transcript length, one line per system."""

from __future__ import annotations

from pathlib import Path

from benchmarks._stats import Spread

__all__ = ["plot_resume"]

_STYLE = {
    "ours, SQLite": ("tab:blue", "o", "-"),
    "ours, PostgreSQL": ("tab:cyan", "s", "-"),
    "LangGraph SqliteSaver": ("tab:orange", "^", "--"),
    "OpenAI Agents SQLiteSession": ("tab:green", "v", "--"),
}


def plot_resume(series: dict[str, dict[int, Spread]], path: Path, *, title_note: str) -> None:
    """Write a log–log PNG of median latency (bars: min–max of the runs) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    for name, (color, marker, line) in _STYLE.items():
        points = series.get(name)
        if not points:
            continue
        lengths = sorted(points)
        medians = [points[n].median * 1e3 for n in lengths]
        below = [(points[n].median - points[n].low) * 1e3 for n in lengths]
        above = [(points[n].high - points[n].median) * 1e3 for n in lengths]
        ax.errorbar(
            lengths,
            medians,
            yerr=[below, above],
            label=name,
            color=color,
            marker=marker,
            linestyle=line,
            capsize=3,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(sorted({n for points in series.values() for n in points}))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.set_xlabel("messages in the transcript")
    ax.set_ylabel("cold resume / restore latency (ms)")
    ax.set_title(f"Cold resume latency against transcript length\n{title_note}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
