"""bench/agents' pictures and table: one PNG per program, systems side by side, and the ratios
of stemma's programs/s to every other system's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

BASELINES = ["llama.cpp", "hf-naive", "no-radix", "fcfs", "no-jump-forward"]


def plot_program(name: str, rows: list[dict[str, Any]], path: Path) -> None:
    """Programs/s, prompt-cache hit rate (the offline optimum dashed) and TTFT p50 per system;
    "n/a" where a system has no value (it failed, or the program has no gen)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [r["system"] for r in rows]
    panels = [
        ("programs_per_s", "programs / s (higher is better)"),
        ("cache_hit_rate", "prompt-cache hit rate (optimum dashed)"),
        ("ttft_p50_s", "TTFT p50 of gens, s (lower is better)"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for ax, (key, title) in zip(axes, panels, strict=True):
        values = [r.get(key) for r in rows]
        colors = ["C0" if s == "stemma" else "C7" for s in systems]
        bars = ax.bar(systems, [v or 0.0 for v in values], color=colors)
        labels = ["n/a" if v is None else f"{v:.3g}" for v in values]
        ax.bar_label(bars, labels=labels, fontsize=8)
        if key == "cache_hit_rate" and rows[0].get("optimum_hit_rate") is not None:
            ax.axhline(rows[0]["optimum_hit_rate"], linestyle="--", color="C3")
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelrotation=35, labelsize=8)
    row = rows[0]
    fig.suptitle(
        f"{name}: {row['num']} programs, {row['concurrency']} in flight "
        f"({row['cpu_isa']}, {row['threads']} threads, {row['dtype']})",
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def ratio_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per program, stemma's programs/s over each baseline's; hit rates beside."""
    present = [b for b in BASELINES if any(r["system"] == b for r in rows)]
    head = ["program", "stemma prog/s", *[f"vs {b}" for b in present], "hit rate (optimum)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for program in dict.fromkeys(r["program"] for r in rows):
        by_system = {r["system"]: r for r in rows if r["program"] == program}
        base = by_system.get("stemma")
        if base is None:
            continue
        cells = [program, f"{base['programs_per_s']:.3g}"]
        for b in present:
            other = by_system.get(b)
            ok = other and other["programs_per_s"] and not other.get("num_errors")
            cells.append(f"{base['programs_per_s'] / other['programs_per_s']:.2f}x" if ok else "—")
        cells.append(f"{base['cache_hit_rate']:.3f} ({base['optimum_hit_rate']:.3f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
