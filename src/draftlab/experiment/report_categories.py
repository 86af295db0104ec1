"""The report's per-category section: a category's paired result only where it has prompts enough for one.

Each arm (at its best setting) is compared with the baseline on each prompt category's prompts alone
(draftlab.benchmark.paired). A category with fewer than ``MIN_CATEGORY_PROMPTS`` prompts gets no speed-up,
accept length or interval here, only a line that says so and how many it has: a bootstrap over two or
three prompts reads as an interval and is not one.
"""

from __future__ import annotations

from typing import Any

from draftlab.benchmark.paired import MIN_CATEGORY_PROMPTS
from draftlab.benchmark.verdict import fmt
from draftlab.textsafe import md, md_table


def category_section(decision: dict[str, Any], client: str) -> list[str]:
    """Accept length and paired speedup per prompt category, each arm at its best setting, where the category
    has at least ``MIN_CATEGORY_PROMPTS`` prompts; the others are named with their counts."""
    body, few = [], {}
    for a in decision.get("arms", []):
        for cat, c in (a["paired"].get("categories") or {}).items():
            if c["prompts"] < MIN_CATEGORY_PROMPTS:
                few[cat] = c["prompts"]
                continue
            ci = c.get("ci95")
            body.append([a["row"]["variant"], a["row"]["spec_id"], cat, str(c["prompts"]), fmt(c["accept_length"]),
                         f"{c['speedup']:.2f}", f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "–"])
    lines = md_table(["variant", "spec", "category", "prompts", "accept length", "paired speedup", "95% CI"],
                     body) if body else []
    if few:
        named = ", ".join(f"{md(c)} ({n})" for c, n in sorted(few.items()))
        lines += ([""] if lines else []) + [
            f"Too few prompts for a per-category interval (fewer than {MIN_CATEGORY_PROMPTS}, paired): {named}. "
            f"These categories count in the decision over all prompts; `bench.clients[].limit` (or a larger "
            f"prompt file) gives each {MIN_CATEGORY_PROMPTS} or more."]
    return lines or [f"(one category, or no paired results, for client `{md(client)}`)"]
