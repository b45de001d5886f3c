"""Human-readable views of a plan."""
from __future__ import annotations

import re
import textwrap
from typing import Optional

from .models import Plan
from .runtimes import RUNTIMES
from .runtimes.base import RuntimeSpec


def table_lines(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r) for r in rows]
    return [ln.rstrip() for ln in lines]


WIDTH = 100  # the plan table fits a 100-column terminal


def _wrap(text: str, indent: str, width: int = WIDTH) -> list[str]:
    """``text`` wrapped to ``width``; continuation lines indented by ``indent``. A word
    longer than a line (a path) stays whole on a line of its own, to be copied."""
    return textwrap.wrap(text, width=width, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False) or [text]


def _clip(text: str, most: int = 24) -> str:
    """A table cell cut to ``most`` characters (the whole value is on the chosen line and
    in plan.json)."""
    return text if len(text) <= most else text[:most - 1] + "…"


_NOT_OFFERED = re.compile(r"^not offered: (.+? prec=\S+): (.+)$", re.S)


def grouped_notes(notes) -> list[str]:
    """The plan's notes for people: the configurations not offered for one same reason (a
    knob the script does not take withholds every configuration with it) said once, with
    how many (each is named in plan.json's notes)."""
    groups: dict[str, list[str]] = {}
    for note in notes:
        m = _NOT_OFFERED.match(note)
        if m:
            groups.setdefault(m.group(2), []).append(m.group(1))
    out, said = [], set()
    for note in notes:
        m = _NOT_OFFERED.match(note)
        if not m or len(groups[m.group(2)]) == 1:
            out.append(note)
        elif m.group(2) not in said:
            said.add(m.group(2))
            out.append(f"not offered: {len(groups[m.group(2)])} configurations (each named in "
                       f"plan.json): {m.group(2)}")
    return out


def _data_bind(runtime: RuntimeSpec, paths: int = 1) -> str:
    """How the job's container has its data, ``paths`` of them (nothing to say without a
    container)."""
    if runtime.recipe_format is None:
        return ""
    that, it, has = ("that path", "it", "has the path") if paths == 1 else \
        ("each one's own path", "them", "has the paths")
    if runtime.read_only_binds:
        return f" (read-only, at {that})"
    return (f" (at {that}; {runtime.name} binds {it} writable where the login may write, "
            f"and its image {has})")


def plan_table(plan: Plan, show: int = 8, out: Optional[str] = None,
               width: int = WIDTH) -> str:
    """The plan for people: the target and image, then the candidates, each followed by
    its reason on an indented line, every line at most ``width`` columns."""
    c = plan.chosen
    img = plan.image
    head = [
        ("", f"MODAK plan for {plan.request} (decided by {plan.decided_by})"),
        ("  target     ", f"{plan.target.name}: {plan.scheduler}, runtime "
         f"{plan.runtime.value}, launcher {plan.launcher.value}, {plan.target.microarchitecture}"
         + (f", {plan.target.accelerators.count}x "
            f"{plan.target.accelerators.model or plan.target.accelerators.vendor}"
            if plan.target.accelerators else "")),
        ("  image      ", f"{img.reference or img.name + ':' + img.tag} ({img.flavour}, "
         f"base {img.base})"),
        ("  score      ", ", ".join(f"{why} +{pts:g}" for why, pts in img.score_breakdown)),
        ("  chosen     ", f"compiler={c.compiler or 'off'} threads={c.threads} "
         f"allocator={c.allocator.value} precision={c.precision.value}"),
    ]
    data = ((plan.dataset,) if plan.dataset else ()) + plan.data_paths
    if data:
        head.append(("  data       ", ", ".join(data)
                     + _data_bind(RUNTIMES[plan.runtime.value], len(data))))
    lines: list[str] = []
    for label, text in head:
        lines += _wrap(label + text, " " * len(label), width)
    lines.append("")
    rows, reasons = [], []
    for cand in plan.candidates[:show]:
        cfg = cand.configuration
        pred = cand.prediction
        rows.append([str(cand.rank), _clip(cfg.image), _clip(cfg.compiler or "off"), str(cfg.threads),
                     cfg.allocator.value, cfg.precision.value,
                     f"{pred.seconds:.3g}" if pred else "-",
                     f"[{pred.low:.3g}, {pred.high:.3g}]" if pred else ""])
        reasons.append(cand.reason)
    table = table_lines(rows, ["#", "image", "compiler", "thr", "alloc", "prec", "s/step",
                               "90% interval"])
    lines += table[:2]
    indent = " " * (len(str(len(rows))) + 2)
    for row_line, reason in zip(table[2:], reasons):
        lines.append(row_line)
        lines += _wrap(indent + reason, indent, width)
    if len(plan.candidates) > show:
        lines.append(f"... {len(plan.candidates) - show} more candidates in plan.json")
    for note in grouped_notes(plan.notes):
        lines += _wrap(f"note: {note}", "      ", width)
    if out:
        lines += _wrap(f"wrote {out}/: plan.json, {plan.job_script}, "
                       + ", ".join(sorted(img.recipes.values())), "  ", width)
    return "\n".join(lines) + "\n"
