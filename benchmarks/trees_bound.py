"""How fast could a draft tree be against the chain on this machine? A bound from a recorded budget sweep.

    python benchmarks/trees_bound.py [benchmarks/trees-sweep-<stamp>.json ...] [--target 1.15]

For every tree of a sweep (`python -m specgen.app.bench.calibrate --sweep`), its cost per committed token is its
drafting plus verification time per step over τ. Two lower bounds keep the tree's measured τ and verification
time and replace only its drafting: (a) drafting costs what the chain's did (a tree whose spine is as deep as the
chain needs at least the chain's sequential draft forwards), (b) drafting is free. Each is compared with the
sweep's chain (`draft`) on the same prompts in the same run, and the drafting time a tree could spend at most to
be `--target` times the chain's speed is given. Per-step loop overhead is left out on both sides (the tree's
fewer steps would only help it a little). Writes benchmarks/trees-bound-latest.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def bounds(summary: dict, target: float) -> list[dict]:
    chain = summary["draft"]
    chain_cost = (chain["draft_s_per_step"] + chain["verify_s_per_step"]) / chain["tau"]  # s per committed token
    rows = []
    for name, row in summary.items():
        if row.get("tree_budget") is None:
            continue
        tau, draft_s, verify_s = row["tau"], row["draft_s_per_step"], row["verify_s_per_step"]
        measured = (draft_s + verify_s) / tau
        chain_drafting = (chain["draft_s_per_step"] + verify_s) / tau
        free = verify_s / tau
        rows.append({"tree": name, "tau": tau, "tau_over_chain": tau / chain["tau"], "draft_ms": 1e3 * draft_s,
                     "verify_ms": 1e3 * verify_s, "measured_vs_chain": chain_cost / measured,
                     "chain_drafting_vs_chain": chain_cost / chain_drafting, "free_drafting_vs_chain": chain_cost / free,
                     # the most a tree may spend drafting per step to be `target` x the chain
                     "max_draft_ms_for_target": 1e3 * (tau * chain_cost / target - verify_s)})
    return rows


def render(records: list[dict], target: float) -> str:
    lines = ["# Draft trees against the chain: a bound from the recorded sweeps", "",
             "`python benchmarks/trees_bound.py " + " ".join(r["sweep"] for r in records) + f" --target {target}`", "",
             "Cost per committed token = (draft + verify time per step) / τ, from each sweep's own `draft` chain and "
             "trees (same prompts, same run). 'chain drafting': the tree's τ and verification with the chain's "
             "drafting time; 'free drafting': verification only. Ratios > 1 mean faster than the chain.", "",
             "| sweep | tree | τ (÷ chain) | draft / verify ms per step | measured vs chain | with chain's drafting | "
             "with free drafting | drafting budget for " + f"{target}× |", "|---|---|---|---|---|---|---|---|"]
    for record in records:
        chain = record["chain"]
        for row in record["rows"]:
            lines.append(f"| {record['sweep']} | `{row['tree']}` | {row['tau']:.2f} ({row['tau_over_chain']:.2f}×) | "
                         f"{row['draft_ms']:.1f} / {row['verify_ms']:.1f} | {row['measured_vs_chain']:.2f}× | "
                         f"{row['chain_drafting_vs_chain']:.2f}× | {row['free_drafting_vs_chain']:.2f}× | "
                         f"{row['max_draft_ms_for_target']:.1f} ms |")
        lines.append(f"| {record['sweep']} | chain `draft` | {chain['tau']:.2f} | {1e3 * chain['draft_s_per_step']:.1f}"
                     f" / {1e3 * chain['verify_s_per_step']:.1f} | 1.00× | — | — | — |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweeps", nargs="*", type=Path,
                   default=[ROOT / "trees-sweep-20261202T201018Z.json", ROOT / "trees-sweep-20261202T201215Z.json"])
    p.add_argument("--target", type=float, default=1.15)
    a = p.parse_args(argv)
    records = []
    for path in a.sweeps:
        summary = json.loads(path.read_text())["summary"]
        records.append({"sweep": path.name, "chain": summary["draft"], "rows": bounds(summary, a.target)})
    (ROOT / "trees-bound-latest.json").write_text(json.dumps({"target": a.target, "records": records}, indent=1)
                                                    + "\n")
    text = render(records, a.target)
    (ROOT / "trees-bound-latest.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
