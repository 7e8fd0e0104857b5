"""What a simulation tells a person: ``summary.json``, a Markdown table per scenario (mean and
min-max over seeds, per mode), a plain comparison of the guard with each baseline, plots, CSV,
and the section in docs/simulator.md.

The same Markdown goes to the terminal and into docs/simulator.md. JSON holds every
number and nothing that varies between runs of the same seed (no wall-clock
time). Plots need matplotlib (the ``sim`` extra) and are skipped, with a note,
when it is not installed.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

SIMPLIFICATIONS = (
    "Only virt-launcher pods of live-migratable VMs are modelled (no other pods); all VMs have equal priority, "
    "so the descheduler's candidate order on a node is a seeded shuffle.",
    "Node score: the profile's rule (positive deviations of CPU use, memory use, CPU and memory pressure from the "
    "workers' average, norm x 3, capped, truncated percent), but pressure is modelled, not measured: 0 up to 70% "
    "use, rising linearly to 1 at 130% demand. Load is sampled every sampleInterval (60 s) and stands for the "
    "1-minute average; the descheduler and the soft-tainter read the latest sample.",
    "Migration: setup (target pod start, 10 s), then a fluid pre-copy model: the source NIC is split evenly among "
    "the node's copying migrations; remaining memory falls at (share - dirty rate); when the dirty rate is not "
    "below the share, only the first pass progresses, then the no-progress timeout (150 s) aborts it; the "
    "completion timeout is 150 s x GiB from the copy start. No post-copy, auto-converge, target NIC limit or "
    "migration network separate from the node NIC.",
    "KubeVirt as v1.8 runs it by default (MigrationPriorityQueue feature gate off): the evacuation controller "
    "runs for a node when a Node, VMI or VMIM of it changes, or 5 s after it found the limits full, and creates "
    "VMIMs (without a priority) only for marked VMIs with room under 5 per cluster and the outbound limit per node (2 "
    "by KubeVirt's default, 1 in the `ocp` baselines as OpenShift Virtualization sets it). A failed "
    "attempt's target pod is still up when the failure's own updates wake it, so the retry is created at the "
    "node's next wake-up, in a quiet node virt-handler's heartbeat (60 s x (1 + 1.2 x U[0,1))), and started once "
    "the backoff has passed: 20 s doubled per failed evacuation VMIM still kept since the last success (5 are "
    "kept, so at most 320 s), counted from that failure. `kubevirt: {migrationPriorityQueue: true}` models v1.9 "
    "(or v1.8 with the gate on): a VMIM for every marked VMI at once, started by priority, then age.",
    "Balance: at each load sample, the std of the schedulable nodes' scores, and the nodes more than the "
    "descheduler's high threshold above their mean (the ones it calls overutilised), each counting until the "
    "next sample.",
    "Transient failures: with the configured probability an attempt fails at a random point (10-100% of its "
    "nominal copy time on an unshared NIC), if it is still copying then.",
    "Targets: nodes with room for the memory request, not cordoned, without a NoSchedule taint; the fewest "
    "soft-tainter taints first, then kube-scheduler's LeastAllocated on requests (lexicographic, not weighted "
    "scores; ties at random).",
    "API calls, watches and controllers are instantaneous, except that virt-controller sets the pod's "
    "eviction-in-progress annotation one second after the mark (so the descheduler's assumed entry comes "
    "first, as in a cluster), and a failed attempt's target virt-launcher exits one second after the failure. "
    "The guard's store is always current, and its migration-history annotation is written the instant a "
    "migration finishes. A VMIM waiting for a slot is looked at again every 5 s (1 s for a system-critical one "
    "with the gate on), and at every load sample.",
    "The descheduler's pod informer sees an update of a launcher pod only when its eviction-in-progress "
    "annotation changes; other pod updates, which would re-add a lapsed entry as observed, are not modelled.",
    "Drains: kubectl drain (cordon) retries refused evictions every 5 s, cluster-autoscaler (taint "
    "ToBeDeletedByClusterAutoscaler, no cordon) every 10 s, both without giving up (the autoscaler's "
    "max-pod-eviction-time is not modelled); drained nodes leave the spread.",
    "The plugin model: filter and pre-eviction filter are one check; its history is fed by every migration that "
    "reached migrationState (an attempt whose target never scheduled is not counted).",
    ("Stall: a descheduler cycle with an overutilised node that started no new eviction because the limits were "
     "full of in-flight entries, one of them a VM whose current evacuation has failed at least once; each such "
     "cycle counts one interval. Per node: an overutilised node (not being drained) from which a cycle started no "
     "eviction while a descheduler-caused evacuation of it had failed at least once; one interval per such cycle."),
    ("Leaving a node: marked for evacuation from it by a descheduler eviction, or with an unfinished "
     "descheduler-caused VMIM (one queued or running after its mark was cancelled still moves the VM); counted "
     "at every instant the node is not being drained."),
    "Time is whole seconds; object timestamps are truncated to the second, as the API server writes them.",
    ("The actuation-priority query (`ocp-actuation`): the operator's recording rules on the model's load samples "
     "(the 5-minute window holds the samples of the last 300 s; `increase` is the count of successes in the last "
     "600 s, without Prometheus's extrapolation). The descheduler (v0.36) counts as `success` only evictions the API "
     "server allowed at once, or a background eviction whose pod is deleted while still in its in-flight cache; a "
     "migrated VM's source pod turns Succeeded first, which drops the entry uncounted, so the node's cooldown "
     "multiplier stays 1 where VMs live-migrate (`ocp-actuation-counted` shows the rule as intended)."),
)

# (label, key, format) of the table's rows; a key with a dot reads evictions.X
ROWS = (
    ("migrations", "migrations_total", "{:.0f}"),
    ("of which caused by the descheduler", "migrations_descheduler", "{:.0f}"),
    ("migrations per VM per day, mean", "migrations_per_vm_day_mean", "{:.2f}"),
    ("migrations per VM per day, max", "migrations_per_vm_day_max", "{:.1f}"),
    ("same VM again within 6 h", "repeat_migrations_6h", "{:.0f}"),
    ("VMs at KubeVirt's alert (12 in 24 h)", "vms_alerting_12_in_24h", "{:.1f}"),
    ("spread: std of node score (points)", "spread_score", "{:.2f}"),
    ("spread: std of node CPU (pp)", "spread_cpu", "{:.2f}"),
    ("nodes above the descheduler's threshold (node-s)", "hot_node_seconds", "{:.0f}"),
    ("... longest one node stayed above it (s)", "hot_longest_seconds", "{:.0f}"),
    ("drain completion (s)", "drain_seconds", "{:.0f}"),
    ("most VMs leaving one node at once (descheduler-caused, not drained)", "max_leaving_per_node", "{:.1f}"),
    ("descheduler stalled by failing in-flight entries (s)", "stall_seconds", "{:.0f}"),
    ("... longest behind one failing VM (s)", "stall_max_one_vm_seconds", "{:.0f}"),
    ("hot node held by a failing evacuation: worst node (s)", "stall_node_max_seconds", "{:.0f}"),
    ("... summed over nodes (s)", "stall_node_seconds", "{:.0f}"),
    ("failed migrations", "failed_migrations", "{:.0f}"),
    ("evictions sent: allowed", "evictions.allowed", "{:.0f}"),
    ("evictions sent: background", "evictions.background", "{:.0f}"),
    ("evictions sent: error (refused)", "evictions.error", "{:.0f}"),
    ("evictions redirected to another pod", "evictions_redirected", "{:.0f}"),
    ("in-flight entries lapsed", "in_flight_lapsed", "{:.0f}"),
    ("stuck evacuations cancelled by the guard", "evacuations_cancelled", "{:.0f}"),
)
LISTED = tuple(k for _, k, _ in ROWS if "." not in k) + ("blocked_by_in_flight_seconds", "in_flight_counted_without_request",
                                                          "vms_migrated", "policy_calls",
                                                          "longest_stall_seconds", "stall_nodes")


def summary_json(scenario, seeds: list[int], modes: list[str], runs: dict, hours: float | None) -> dict:
    """The issue's shape: every metric a list with one value per seed, in seed order."""
    out_modes = {}
    for m in modes:
        per_seed = [runs[(s, m)][0] for s in seeds]
        entry: dict = {k: [p[k] for p in per_seed] for k in LISTED}
        entry["evictions"] = {a: [p["evictions"][a] for p in per_seed] for a in ("allowed", "background", "error")}
        entry["failures_by_kind"] = [p["failures_by_kind"] for p in per_seed]
        entry["drains"] = [p["drains"] for p in per_seed]
        out_modes[m] = entry
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "hours": hours if hours is not None else scenario.hours,
        "seeds": list(seeds),
        "vms": len(scenario.vms),
        "nodes": len(scenario.nodes),
        "descheduler_interval_s": scenario.descheduler.interval,
        "modes": out_modes,
        "simplifications": list(SIMPLIFICATIONS),
    }


def _values(entry: dict, key: str) -> list:
    if "." in key:
        a, b = key.split(".")
        return entry[a][b]
    return entry[key]


def cell(values: list, fmt: str) -> str:
    if any(v is None for v in values):
        done = [v for v in values if v is not None]
        return "not finished" if not done else f"{fmt.format(sum(done) / len(done))} ({len(values) - len(done)} unfinished)"
    mean = sum(values) / len(values)
    if len(values) == 1 or min(values) == max(values):
        return fmt.format(mean)
    return f"{fmt.format(mean)} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def table(summary: dict) -> str:
    modes = list(summary["modes"])
    m = summary["modes"]
    head = "| | " + " | ".join(f"`{x}`" for x in modes) + " |\n|---|" + "---:|" * len(modes) + "\n"
    lines = []
    for label, key, fmt in ROWS:
        vals = [_values(m[x], key) for x in modes]
        if key == "drain_seconds" and all(v is None for vs in vals for v in vs):
            continue
        lines.append(f"| {label} | " + " | ".join(cell(v, fmt) for v in vals) + " |\n")
    return head + "".join(lines)


def _mean(entry: dict, key: str) -> float | None:
    vals = [v for v in _values(entry, key) if v is not None]
    return sum(vals) / len(vals) if vals else None


def _change(new: float | None, old: float | None) -> str:
    if new is None or old is None:
        return "n/a"
    if old == 0:
        return "same (0)" if new == 0 else f"{new:.0f} vs 0"
    pct = 100 * (new - old) / old
    return f"{pct:+.0f}%"


def comparison(summary: dict) -> str:
    """Each guard mode against its own baseline and against the node limit of 1 of its kind, in plain numbers."""
    m = summary["modes"]
    lines = []
    for mode in m:
        if "+" not in mode:
            continue
        g = m[mode]
        base = mode.split("+")[0]
        one = (base.replace("ocp", "ocp-node1", 1) if base in ("ocp", "ocp-kv19") else
               "node-limit-1" if not base.startswith("ocp") else base)
        bases = [b for b in (base, one) if b in m]
        for b in dict.fromkeys(bases):
            o = m[b]
            parts = [
                f"migrations {_change(_mean(g, 'migrations_total'), _mean(o, 'migrations_total'))}",
                f"repeats within 6 h {_change(_mean(g, 'repeat_migrations_6h'), _mean(o, 'repeat_migrations_6h'))}",
                f"max per VM per day {_change(_mean(g, 'migrations_per_vm_day_max'), _mean(o, 'migrations_per_vm_day_max'))}",
                f"score spread {_change(_mean(g, 'spread_score'), _mean(o, 'spread_score'))}",
                f"CPU spread {_change(_mean(g, 'spread_cpu'), _mean(o, 'spread_cpu'))}",
                f"stall {_change(_mean(g, 'stall_seconds'), _mean(o, 'stall_seconds'))}",
            ]
            if _mean(o, "drain_seconds") is not None or _mean(g, "drain_seconds") is not None:
                parts.append(f"drain time {_change(_mean(g, 'drain_seconds'), _mean(o, 'drain_seconds'))}")
            lines.append(f"- `{mode}` vs `{b}`: " + ", ".join(parts) + ".")
    return "\n".join(lines)


GOAL_CUT, SPREAD_TOLERANCE = 0.30, 1.05
# the plain settings a user can write today, per KubeVirt version, and the guard at its defaults in front of them
TODAY = {"1.8.3": (("ocp", "ocp-node1", "ocp-actuation"), "ocp+guard"),
         "1.9": (("ocp-kv19", "ocp-node1-kv19", "ocp-actuation-kv19"), "ocp-kv19+guard")}


def best_plain(m: dict, baselines: tuple[str, ...]) -> str | None:
    """Of today's plain settings, the one that moves fewest VMs among those whose score spread is within 5% of
    the best spread any of them reaches."""
    present = [b for b in baselines if b in m and _mean(m[b], "spread_score") is not None]
    if not present:
        return None
    floor = min(_mean(m[b], "spread_score") for b in present)
    fair = [b for b in present if _mean(m[b], "spread_score") <= SPREAD_TOLERANCE * floor]
    return min(fair, key=lambda b: (_mean(m[b], "migrations_total"), baselines.index(b)))


def goal(summary: dict) -> list[tuple[str, str, str, float, float, bool]]:
    """Per KubeVirt version: (version, guard mode, best plain, migration change, spread ratio, met)."""
    m = summary["modes"]
    out = []
    for version, (baselines, guard) in TODAY.items():
        best = best_plain(m, baselines)
        if best is None or guard not in m:
            continue
        g_mig, b_mig = _mean(m[guard], "migrations_total"), _mean(m[best], "migrations_total")
        g_spr, b_spr = _mean(m[guard], "spread_score"), _mean(m[best], "spread_score")
        cut = (b_mig - g_mig) / b_mig if b_mig else 0.0
        ratio = g_spr / b_spr if b_spr else (1.0 if g_spr == 0 else float("inf"))
        out.append((version, guard, best, cut, ratio, cut >= GOAL_CUT and ratio <= SPREAD_TOLERANCE))
    return out


def goal_text(summary: dict) -> str:
    return "\n".join(
        f"- KubeVirt {v}: `{g}` against the best plain setting `{b}`: migrations {-cut:+.0%}, score spread "
        f"x{ratio:.2f}: goal (-30%, spread at most x1.05) " + ("met." if met else "**not met**.")
        for v, g, b, cut, ratio, met in goal(summary))


def header(summary: dict) -> str:
    seeds = summary["seeds"]
    seed_text = f"seeds {seeds[0]}–{seeds[-1]}" if len(seeds) > 1 and seeds == list(range(seeds[0], seeds[-1] + 1)) \
        else "seed" + ("s " if len(seeds) > 1 else " ") + ", ".join(map(str, seeds))
    return (f"**{summary['scenario']}** ({summary['vms']} VMs on {summary['nodes']} nodes, {summary['hours']:g} h, "
            f"descheduler every {summary['descheduler_interval_s']} s, {seed_text}; mean (min–max) over seeds)")


def render(summary: dict) -> str:
    out = [header(summary), "", table(summary)]
    c = comparison(summary)
    if c:
        out += [c, ""]
    g = goal_text(summary)
    if g:
        out += [g, ""]
    return "\n".join(out)


def write_summary(summary: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "summary.json"
    path.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def write_csv(runs: dict, out_dir: Path) -> list[Path]:
    """The time series of every run: spread every 10 minutes, and every migration."""
    out_dir.mkdir(parents=True, exist_ok=True)
    spread, migrations = out_dir / "spread.csv", out_dir / "migrations.csv"
    with spread.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["mode", "seed", "t_seconds", "score_std", "cpu_std_pp"])
        for (seed, mode), (_, series, _) in sorted(runs.items()):
            for p in series["spread"]:
                w.writerow([mode, seed, p["t"], p["score_std"], p["cpu_std"]])
    with migrations.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["mode", "seed", "vm", "cause", "start_s", "end_s", "source", "target", "failed", "failure",
                    "copy_start_s"])
        for (seed, mode), (_, series, _) in sorted(runs.items()):
            for r in series["migrations"]:
                w.writerow([mode, seed, r["vm"], r["cause"], r["start"], "" if r["end"] is None else r["end"],
                            r["source"], r["target"], r["failed"], r["failure"],
                            "" if r.get("copy_start") is None else r["copy_start"]])
    return [spread, migrations]


# one look per mode, distinct without colour too (line style and marker), in the order the modes are given
STYLES = (("tab:blue", "-", "o"), ("tab:orange", "--", "s"), ("tab:green", "-.", "^"), ("tab:red", ":", "D"),
          ("tab:purple", (0, (5, 1, 1, 1)), "v"), ("tab:brown", (0, (3, 1, 1, 1, 1, 1)), "P"),
          ("tab:pink", (0, (1, 1)), "X"), ("tab:gray", (0, (8, 2)), "*"), ("tab:olive", "-", "h"),
          ("tab:cyan", "--", "<"))


def style(i: int) -> dict:
    colour, line, marker = STYLES[i % len(STYLES)]
    return {"color": colour, "linestyle": line, "marker": marker}


def write_plots(summary: dict, runs: dict, seed: int, modes: list[str], out_dir: Path) -> list[Path] | None:
    """Migrations per hour, spread over time and a per-VM migration timeline (one seed), each as small
    multiples: one panel per mode on shared axes, the other modes faint behind it for comparison.
    None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    name = summary["scenario"]
    hours = summary["hours"]
    per_hour = {}
    for mode in modes:
        counts = runs[(seed, mode)][1]["migrations_per_hour"]
        per_hour[mode] = [a + b for a, b in zip(counts["descheduler"], counts["drain"])]
    spread = {mode: ([p["t"] / 3600 for p in runs[(seed, mode)][1]["spread"]],
                     [p["score_std"] for p in runs[(seed, mode)][1]["spread"]]) for mode in modes}
    paths = [
        _small_multiples(plt, modes, out_dir / f"{name}-migrations-per-hour.png",
                         f"{name} (seed {seed}): migrations started per hour, one panel per mode",
                         "migrations", {m: (list(range(len(v) + 1)), v + v[-1:]) for m, v in per_hour.items()},
                         step=True),
        _small_multiples(plt, modes, out_dir / f"{name}-spread.png",
                         f"{name} (seed {seed}): spread, std of node score across schedulable nodes", "score points",
                         spread, step=False),
    ]
    fig, axes = plt.subplots(len(modes), 1, figsize=(11, 1.2 + 1.6 * len(modes)), sharex=True, squeeze=False)
    for ax, mode in zip(axes[:, 0], modes):
        migrations = runs[(seed, mode)][1]["migrations"]
        vms = sorted({r["vm"] for r in migrations})
        row = {vm: i for i, vm in enumerate(vms)}
        for r in migrations:  # a tick at the start, a bar for the duration (most are too short to see)
            end = r["end"] if r["end"] is not None else hours * 3600
            colour = "tab:red" if r["failed"] else ("tab:blue" if r["cause"] == "descheduler" else "tab:green")
            ax.plot([r["start"] / 3600, end / 3600], [row[r["vm"]]] * 2, color=colour, linewidth=1.5,
                    solid_capstyle="butt")
            ax.plot([r["start"] / 3600], [row[r["vm"]]], marker="|", color=colour, markersize=4)
        ax.set_title(f"{mode}: {len(migrations)} migrations of {len(vms)} VMs", fontsize=9, loc="left")
        ax.set_ylabel("VM")
        ax.set_yticks([])
        ax.set_xlim(0, hours)
    axes[-1, 0].set_xlabel("simulated hours")
    fig.suptitle(f"{name} (seed {seed}): each row a VM that migrated; blue descheduler, green drain, red failed",
                 fontsize=10)
    fig.tight_layout()
    paths.append(out_dir / f"{name}-timeline.png")
    fig.savefig(paths[-1], dpi=90)
    plt.close(fig)
    return paths


def _small_multiples(plt, modes: list[str], path: Path, title: str, ylabel: str,
                     data: dict[str, tuple[list, list]], step: bool) -> Path:
    """One panel per mode, shared axes; the mode in its own style, every other mode thin and grey behind it."""
    columns = 1 if len(modes) <= 3 else 2
    rows = -(-len(modes) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(11, 1.0 + 2.0 * rows), sharex=True, sharey=True,
                             squeeze=False)
    for i, mode in enumerate(modes):
        ax = axes[i // columns][i % columns]
        for other in modes:
            if other != mode:
                x, y = data[other]
                (ax.step(x, y, where="post") if step else ax.plot(x, y))[0].set(color="0.8", linewidth=0.8)
        x, y = data[mode]
        look = style(i)
        every = max(1, len(x) // 12)
        if step:
            ax.step(x, y, where="post", color=look["color"], linestyle=look["linestyle"], linewidth=1.6)
            ax.plot(x, y, linestyle="none", marker=look["marker"], color=look["color"], markersize=4, markevery=every)
        else:
            ax.plot(x, y, linewidth=1.3, markersize=4, markevery=every, **look)
        ax.set_title(f"{mode} (grey: the other modes)", fontsize=9, loc="left")
        ax.grid(True, linewidth=0.3, alpha=0.5)
    for j in range(len(modes), rows * columns):  # an empty last panel: the one above it shows the hours
        axes[j // columns][j % columns].set_visible(False)
        axes[j // columns - 1][j % columns].tick_params(labelbottom=True)
        axes[j // columns - 1][j % columns].set_xlabel("simulated hours")
    for ax in axes[-1]:
        ax.set_xlabel("simulated hours")
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


BEGIN, END = "<!-- simulate:begin -->", "<!-- simulate:end -->"


def readme_section(summaries: list[dict], command: str) -> str:
    body = [
        BEGIN,
        "Regenerated by `make simulate` (deterministic: same seeds, same numbers), which runs",
        "",
        f"    {command}",
        "",
        "Every mode runs the same descheduler model on the same workload; only its settings, KubeVirt's version and",
        "the protection layer differ. `ocp` is OpenShift 4.22's KubeVirtRelieveAndMigrate as the descheduler operator",
        "writes it (KubevirtMigrationAware plugin, `evictionLimits.node: 2`, 2 per node, 5 in total) with KubeVirt's",
        "`parallelOutboundMigrationsPerNode: 1` as OpenShift Virtualization sets it; `ocp-node1` the same with the",
        "CR's `evictionLimits.node: 1`; `ocp-actuation` the same with the query",
        "`descheduler:node:actuation_priority:p66_5m`; `-kv19` on KubeVirt 1.9 (MigrationPriorityQueue GA), the",
        "others on 1.8.3; `ocp-actuation-counted` is a what-if (the actuation query if the descheduler counted",
        "finished background evictions as successes, which v0.36 does not). `+guard` is the guard at its defaults",
        "(canceller on, steering on: the descheduler reads Prometheus), `+guard-nosteer` the guard without steering.",
        "The goal line: the guard at its defaults against the best plain setting of the same KubeVirt version (of",
        "`ocp`, `ocp-node1`, `ocp-actuation`: the one with fewest migrations among those whose score spread is within",
        "5% of the best of them); met at 30% fewer migrations with a spread at most 1.05 times its.",
        "Cells are the mean over seeds, with min–max in brackets. Spread is time-weighted (sampled",
        "every minute) over schedulable nodes.",
        "",
    ]
    for s in summaries:
        body += [render(s), ""]
        if s.get("description"):
            body += [f"*{s['scenario']}*: {s['description']}", ""]
    body += ["Simplifications of the model:", ""] + [f"- {x}" for x in SIMPLIFICATIONS] + [END]
    return "\n".join(body)


def update_readme(path: Path, section: str) -> None:
    """Replace the text between the markers (``run.check_readme`` made sure they are there)."""
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{path}: no {BEGIN} ... {END} section")
    path.write_text(pattern.sub(lambda _: section, text), encoding="utf-8")


def out_readme(summaries: list[dict], modes: dict[str, str], command: str, files: dict[str, list[str]]) -> str:
    """The output folder's README.md: how it was made, what each mode is (``modes``: name -> description,
    ``guards.mode_description``), what each file holds, the results and the model's simplifications (written here
    once, not printed on every run)."""
    lines = ["# Simulator results", "", "Written by", "", f"    {command}", "",
             "Deterministic: the same command gives the same numbers.", "", "## The modes", "",
             "Every mode runs the same descheduler model on the same workload; only the protection layer in front "
             "of KubeVirt differs.", "", "| mode | what runs |", "|---|---|"]
    lines += [f"| `{m}` | {text} |" for m, text in modes.items()]
    lines += ["", "## The files", ""]
    kinds = {"summary.json": "every number per mode and seed (each metric a list, one value per seed)",
             "migrations-per-hour.png": "migrations started per hour, one panel per mode (first seed)",
             "spread.png": "the spread (std of the node score) over time, one panel per mode (first seed)",
             "timeline.png": "every migration of every VM, one panel per mode (first seed)",
             "spread.csv": "the spread every 10 minutes, per mode and seed",
             "migrations.csv": "every migration, per mode and seed"}
    for folder, names in files.items():
        for name in names:
            what = next((v for k, v in kinds.items() if name.endswith(k)), "")
            lines.append(f"- `{folder + '/' if folder else ''}{name}`: {what}")
    lines += ["", "## Results", ""]
    for summary in summaries:
        lines += [render(summary), ""]
    lines += ["## Simplifications of the model", ""] + [f"- {x}" for x in SIMPLIFICATIONS]
    return "\n".join(lines) + "\n"
