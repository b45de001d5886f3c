"""Human-readable views of a plan."""
from __future__ import annotations

from typing import Optional

from .models import Plan


def table_lines(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r) for r in rows]
    return [ln.rstrip() for ln in lines]


def plan_table(plan: Plan, show: int = 8, out: Optional[str] = None) -> str:
    c = plan.chosen
    img = plan.image
    lines = [
        f"MODAK plan for {plan.request} (decided by {plan.decided_by})",
        f"  target     {plan.target.name}: {plan.scheduler.value}, runtime {plan.runtime.value}, "
        f"launcher {plan.launcher.value}, {plan.target.microarchitecture}"
        + (f", {plan.target.accelerators.count}x {plan.target.accelerators.model or plan.target.accelerators.vendor}"
           if plan.target.accelerators else ""),
        f"  image      {img.reference or img.name + ':' + img.tag} ({img.flavour}, base {img.base})",
        "  score      " + ", ".join(f"{why} +{pts:g}" for why, pts in img.score_breakdown),
        f"  chosen     compiler={c.compiler or 'off'} threads={c.threads} "
        f"allocator={c.allocator.value} precision={c.precision.value}",
        "",
    ]
    rows = []
    for cand in plan.candidates[:show]:
        cfg = cand.configuration
        pred = cand.prediction
        rows.append([str(cand.rank), cfg.image, cfg.compiler or "off", str(cfg.threads),
                     cfg.allocator.value, cfg.precision.value,
                     f"{pred.seconds:.3g} [{pred.low:.3g}, {pred.high:.3g}]" if pred else "-",
                     cand.reason])
    lines += table_lines(rows, ["#", "image", "compiler", "thr", "alloc", "prec", "predicted s",
                           "why"])
    if len(plan.candidates) > show:
        lines.append(f"... {len(plan.candidates) - show} more candidates in plan.json")
    for note in plan.notes:
        lines.append(f"note: {note}")
    if out:
        lines.append(f"wrote {out}/: plan.json, {plan.job_script}, "
                     + ", ".join(sorted(img.recipes.values())))
    return "\n".join(lines) + "\n"
