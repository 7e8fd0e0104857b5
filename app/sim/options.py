"""``simulate``'s flags, apart from the simulator: the command line builds its parser without loading it."""

from __future__ import annotations

import argparse
import os

from app.sim.report import BEGIN, END

# the default comparison: today's plain OpenShift settings on KubeVirt 1.8.3 and 1.9, and the guard at its defaults
# in front of the shipped profile (and, on 1.8.3, without steering)
MODES = ("ocp", "ocp-node1", "ocp-actuation", "ocp+guard", "ocp+guard-nosteer",
         "ocp-kv19", "ocp-node1-kv19", "ocp-actuation-kv19", "ocp-kv19+guard")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", action="append", required=True, metavar="FILE",
                   help="scenario YAML (examples/scenarios/); repeat for several")
    p.add_argument("--seeds", metavar="LIST", help="seeds, e.g. 1-10 or 1,4,7 (default: the scenario's seed)")
    p.add_argument("--seed", type=int, help=argparse.SUPPRESS)  # older spelling of --seeds N
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {','.join(MODES)} (off = upstream)")
    p.add_argument("--hours", type=float, help="simulated hours (default: the scenario's)")
    p.add_argument("--out", metavar="DIR", help="write summary.json, PNG plots (with matplotlib) and CSV here")
    p.add_argument("--format", choices=("json", "csv"), default="json", help="csv: also write the time series")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (default 2)")
    p.add_argument("--guard-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a guard setting (its --config name) for the guard modes; repeatable")
    p.add_argument("--snapshot", metavar="DUMP",
                   help="start from a cluster dump (kubectl get vmi,vmim,pods,nodes -A -o yaml); load from the scenario")
    p.add_argument("--readme", metavar="FILE",
                   help=f"write the comparison into this Markdown file, between its {BEGIN} and {END} lines")
    p.add_argument("--force", action="store_true", help="write into an --out folder that is not empty (replacing "
                                                         "the files of the same names)")
