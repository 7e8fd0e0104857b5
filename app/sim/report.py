"""What a simulation tells a person: a table per scenario, the targets, JSON, plots.

The table is Markdown, so the same text goes to the terminal and into the
README. JSON holds every number (and nothing that varies between runs of the
same seed, such as wall-clock time). Plots need matplotlib (the ``sim`` extra)
and are skipped, with a note, when it is not installed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

SIMPLIFICATIONS = (
    "Only virt-launcher pods of live-migratable VMs are modelled (no other pods); all VMs have equal priority, "
    "so the descheduler's candidate order on a node is a seeded shuffle.",
    "Node utilisation follows the profile's rule (positive deviations of CPU use, memory use, CPU and memory "
    "pressure from the workers' average, norm x 3, capped) but pressure is modelled, not measured: 0 up to "
    "70% use, rising linearly to 1 at 130% demand.",
    "Load is sampled every sampleInterval (60 s, Prometheus' avg1m); the descheduler reads the latest sample.",
    "A migration takes setup + memory / (bandwidth - dirty rate) with a fixed bandwidth per migration (no shared "
    "NIC), no post-copy or auto-converge; the completion timeout (150 s/GiB) and the no-progress timeout (150 s) "
    "abort it. Random failures happen at a random point of the migration.",
    "Targets: nodes whose memory requests fit, untainted first, then kube-scheduler's LeastAllocated on "
    "requests (ties at random).",
    "API calls, watches and controllers are instantaneous: the VMI mark and the pod's eviction-in-progress "
    "annotation appear at once, and the guard's store is always current (its cache is never stale).",
    "kubectl drain retries refused evictions every 5 s without a timeout; drained nodes leave the spread.",
    "Time to rebalance: from a load step to the end of the first 15-minute window whose mean max-min CPU spread "
    "is within 120% of that mode's mean over the hour before the step.",
    "A restarted descheduler finds pods still annotated eviction-in-progress; the plugin rebuilds its history "
    "from the Succeeded VMIMs KubeVirt keeps (5 per VMI).",
    "Time is whole seconds; object timestamps are truncated to the second, as the API server writes them.",
)

TARGETS = {
    "cut_vs_off": 0.80,
    "cut_vs_plugin": 0.30,
    "spread_ratio": 1.2,
}


def _fmt_s(seconds) -> str:
    if seconds is None:
        return "not within run"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s"


def _hm(seconds: int) -> str:
    h, rem = divmod(int(seconds), 3600)
    return f"{h}h{rem // 60:02d}m" if rem else f"{h}h"


def scenario_header(result: dict) -> str:
    return (f"**{result['scenario']}** ({result['vms']} VMs on {result['nodes']} nodes, {result['hours']:g} h, "
            f"seed {result['seed']}, descheduler every {_fmt_s(result['descheduler_interval_s'])})")


def table(result: dict) -> str:
    modes = list(result["modes"])
    m = result["modes"]
    rows: list[tuple[str, list[str]]] = []

    def row(label: str, fn) -> None:
        rows.append((label, [fn(m[k]) for k in modes]))

    row("migrations (per VM per day)", lambda s: f"{s['migrations']} ({s['migrations_per_vm_per_day']:.2f})")
    row("succeeded / failed", lambda s: f"{s['succeeded']} / {s['failed']}")
    row("VMs moved at least once", lambda s: str(s["vms_migrated"]))
    row("same VM moved again within 1 h", lambda s: str(s["repeat_moves_within_1h"]))
    row("descheduler evacuations while another from that node pending",
        lambda s: str(s["concurrent_descheduler_evacuations"]))
    row("descheduler eviction requests / started in background",
        lambda s: f"{s['descheduler_eviction_requests']} / {s['descheduler_background_evictions']}")
    reasons = sorted({r for s in m.values() for r in s["descheduler_refusals_by_reason"]})
    for r in reasons:
        row(f"refused or skipped: {r}", lambda s, r=r: str(s["descheduler_refusals_by_reason"].get(r, 0)))
    row("CPU spread std, mean / p95 (pp)", lambda s: f"{s['cpu_spread_std_pp']['mean']:.1f} / {s['cpu_spread_std_pp']['p95']:.1f}")
    row("CPU spread max-min, mean / p95 (pp)",
        lambda s: f"{s['cpu_spread_range_pp']['mean']:.1f} / {s['cpu_spread_range_pp']['p95']:.1f}")
    for i, step in enumerate(result["modes"][modes[0]]["rebalance_after_step_s"]):
        row(f"rebalanced after load step at {_hm(step['step_at_s'])}",
            lambda s, i=i: _fmt_s(s["rebalance_after_step_s"][i]["seconds"]))
    for i, drain in enumerate(result["modes"][modes[0]]["drains"]):
        row(f"drain of {drain['node']} at {_hm(drain['start_s'])} took (VMs on it)",
            lambda s, i=i: f"{_fmt_s(s['drains'][i]['seconds'])} ({s['drains'][i]['vms_at_start']})")
    head = "| | " + " | ".join(modes) + " |\n|---|" + "---:|" * len(modes) + "\n"
    return head + "".join(f"| {label} | " + " | ".join(vals) + " |\n" for label, vals in rows)


def targets(result: dict) -> dict:
    """The issue's targets, measured (only when off, plugin and guard all ran)."""
    m = result["modes"]
    if not all(k in m for k in ("off", "plugin", "guard")):
        return {}
    off, plugin, guard = m["off"], m["plugin"], m["guard"]

    def cut(base: dict) -> float | None:
        return None if base["migrations"] == 0 else round(1 - guard["migrations"] / base["migrations"], 3)

    off_std = off["cpu_spread_std_pp"]["mean"]
    drains = []
    for g, o in zip(guard["drains"], off["drains"]):
        drains.append({"node": g["node"], "guard_s": g["seconds"], "off_s": o["seconds"],
                       "met": g["seconds"] is not None and (o["seconds"] is None or g["seconds"] <= o["seconds"])})
    out = {
        "cut_vs_off": cut(off),
        "cut_vs_plugin": cut(plugin),
        "guard_concurrent_evacuations": guard["concurrent_descheduler_evacuations"],
        "spread_ratio": None if off_std == 0 else round(guard["cpu_spread_std_pp"]["mean"] / off_std, 3),
        "drains": drains,
    }
    out["met"] = {
        "cut_vs_off": out["cut_vs_off"] is not None and out["cut_vs_off"] >= TARGETS["cut_vs_off"],
        "cut_vs_plugin": out["cut_vs_plugin"] is not None and out["cut_vs_plugin"] >= TARGETS["cut_vs_plugin"],
        "no_concurrent_evacuations": out["guard_concurrent_evacuations"] == 0,
        "spread_ratio": out["spread_ratio"] is not None and out["spread_ratio"] <= TARGETS["spread_ratio"],
        "drains_no_slower": all(d["met"] for d in drains),
    }
    return out


def targets_text(result: dict) -> str:
    t = result.get("targets") or {}
    if not t:
        return ""
    ok = t["met"]

    def mark(flag: bool) -> str:
        return "met" if flag else "MISSED"

    def pct(x) -> str:
        return "n/a" if x is None else f"{100 * x:.0f}%"

    parts = [
        f"guard cuts migrations by {pct(t['cut_vs_off'])} vs off (target >= 80%: {mark(ok['cut_vs_off'])})",
        f"by {pct(t['cut_vs_plugin'])} vs plugin (>= 30%: {mark(ok['cut_vs_plugin'])})",
        f"concurrent evacuations {t['guard_concurrent_evacuations']} (0: {mark(ok['no_concurrent_evacuations'])})",
        f"spread {t['spread_ratio']}x off (<= 1.2x: {mark(ok['spread_ratio'])})",
    ]
    if t["drains"]:
        parts.append("drains " + ", ".join(f"{_fmt_s(d['guard_s'])} vs off {_fmt_s(d['off_s'])}" for d in t["drains"])
                     + f" (no slower: {mark(ok['drains_no_slower'])})")
    return "Targets: " + "; ".join(parts) + "."


def render(result: dict) -> str:
    out = [scenario_header(result), "", table(result)]
    t = targets_text(result)
    if t:
        out += [t, ""]
    return "\n".join(out)


def write_json(result: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result['scenario']}.json"
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def write_plots(result: dict, runs: dict, out_dir: Path) -> list[Path] | None:
    """Utilisation per node over time (one panel per mode) and migrations per hour per
    mode; None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    name = result["scenario"]
    modes = list(runs)
    fig, axes = plt.subplots(len(modes), 1, figsize=(11, 2.6 * len(modes)), sharex=True, sharey=True, squeeze=False)
    for ax, mode in zip(axes[:, 0], modes):
        d = runs[mode]
        hours = [t / 3600 for t in d.sample_times]
        for node, series in zip(d.node_names, d.node_cpu):
            ax.plot(hours, [100 * u for u in series], linewidth=0.6)
        ax.set_title(f"{name}: CPU utilisation per node, {mode}", fontsize=9)
        ax.set_ylabel("% of node CPU")
    axes[-1, 0].set_xlabel("simulated hours")
    fig.tight_layout()
    util = out_dir / f"{name}-utilisation.png"
    fig.savefig(util, dpi=90)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(11, 3.2))
    for mode in modes:
        per_hour = result["modes"][mode]["migrations_per_hour"]
        ax.step(range(len(per_hour)), per_hour, where="post", label=mode)
    ax.set_title(f"{name}: migrations started per hour", fontsize=9)
    ax.set_xlabel("simulated hours")
    ax.set_ylabel("migrations")
    ax.legend()
    fig.tight_layout()
    mig = out_dir / f"{name}-migrations.png"
    fig.savefig(mig, dpi=90)
    plt.close(fig)
    return [util, mig]


BEGIN, END = "<!-- simulate:begin -->", "<!-- simulate:end -->"
HEADING = "## What the guard does to a cluster"


def readme_section(results: list[dict], command: str) -> str:
    body = [
        BEGIN,
        "Regenerate with `make simulate` (deterministic: same seed, same numbers), which runs",
        "",
        f"    {command}",
        "",
        "Each scenario runs the same workload",
        "three times: `off` (descheduler and KubeVirt alone), `plugin` (the reference KubevirtMigrationAware",
        "evictor plugin, re-implemented), `guard` (this project's policy code, default settings unless the scenario",
        "sets them). Spread is the standard deviation (and max - min) of CPU utilisation across schedulable nodes,",
        "in percentage points, sampled every minute.",
        "",
    ]
    for r in results:
        body += [render(r), ""]
        if r.get("description"):
            body += [f"*{r['scenario']}*: {r['description']}", ""]
    body += ["Simplifications of the model:", ""] + [f"- {s}" for s in SIMPLIFICATIONS] + [END]
    return "\n".join(body)


def update_readme(path: Path, section: str) -> None:
    """Replace the text between the markers, or append the section under its heading."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip("\n") + f"\n\n{HEADING}\n\n{section}\n"
    path.write_text(text, encoding="utf-8")
