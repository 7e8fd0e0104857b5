"""A mutation probe: plausible one-line bugs in the policy, cluster, effects, admission and transport code, each applied to a
fresh copy of the committed tree (``git archive HEAD``) and run against the tests that cover its package; a mutant
is killed when a test fails. Prints one line per mutant and the kill rate.

    .venv/bin/python tools/mutant_probe.py [--only SUBSTRING] [--full]

``--full`` runs the whole suite (what ``make test`` runs) for each mutant instead of the package's tests (about
five minutes a mutant on two cores). Nothing in the working tree is touched.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TESTS = {
    "policy": ["tests/test_policy_table.py", "tests/test_cooldown.py", "tests/test_node_budget.py",
               "tests/test_node_moves.py", "tests/test_cancel_policy.py", "tests/test_steering.py",
               "tests/test_per_vm_choices.py", "tests/test_history.py", "tests/test_kubevirt19_fixtures.py",
               "tests/test_inspect.py", "tests/test_readme.py"],
    "cluster": ["tests/test_informer.py", "tests/test_store_layout.py", "tests/test_migrations_counter.py",
                "tests/test_fresh_leavers.py", "tests/test_records_snapshot.py", "tests/test_serve_live.py",
                "tests/test_report_history.py", "tests/test_descheduler_check.py"],
    "effects": ["tests/effects", "tests/test_history.py"],
    "admission": ["tests/test_admission_endpoint.py", "tests/test_http.py", "tests/test_bad_input.py",
                  "tests/test_hostile_input.py", "tests/test_fresh_leavers.py", "tests/test_readme.py"],
    "transport": ["tests/test_http_protocol.py", "tests/test_http.py"],
}


@dataclass(frozen=True)
class Mutant:
    package: str
    path: str
    old: str
    new: str
    what: str


MUTANTS = [
    # ---- app/policy
    Mutant("policy", "app/policy/decide.py", "state.uid == job and state.in_flight:", "state.uid == job:",
           "a pod labelled with the VMI's ended migration counts as its target"),
    Mutant("policy", "app/policy/decide.py", "        if len(leaving) >= budget:", "        if len(leaving) > budget:",
           "the node budget lets one more VM leave"),
    Mutant("policy", "app/policy/decide.py",
           "return req.requested_by == DESCHEDULER_REQUESTER or req.username in settings.descheduler_users",
           "return req.requested_by == DESCHEDULER_REQUESTER",
           "deschedulerUsers ignored"),
    Mutant("policy", "app/policy/cooldown.py", "    cooldown = base * (2 ** (max(count, 1) - 1))",
           "    cooldown = base * (2 ** max(count, 1))", "the backoff doubles once too often"),
    Mutant("policy", "app/policy/cooldown.py", "    if cap > 0 and cooldown > cap:", "    if cap > 0 and cooldown > 2 * cap:",
           "the cap is not applied"),
    Mutant("policy", "app/policy/cooldown.py", "count = sum(1 for f in finished if f.end > horizon)",
           "count = sum(1 for f in finished if f.end >= horizon - 60)", "the window counts a minute too much"),
    Mutant("policy", "app/policy/cancel.py", "        if any(m.priority == DRAIN_PRIORITY for m in migrations if not m.finished):",
           "        if False:", "the canceller would cancel a drain's evacuation"),
    Mutant("policy", "app/policy/nodecool.py", "    ours = [m for m in moves if m.end is not None and m.end <= now and descheduler_caused(m, view)]",
           "    ours = [m for m in moves if m.end is not None and m.end <= now]", "node cooldown counts every migration"),
    # ---- app/cluster
    Mutant("cluster", "app/cluster/informer.py",
           '            self.status.broken(f"resourceVersion expired ({outcome.detail}): events were lost; relisting")\n',
           "", "the window between a 410 and the relist is not stale"),
    Mutant("cluster", "app/cluster/informer.py", "        if news == 0 and time.monotonic() - started < self.opts.quick_end:",
           "        if False:", "a watch that ends at once is retried at once (spins)"),
    Mutant("cluster", "app/cluster/informer.py", '            return Outcome("expired", relist=True, level=logging.INFO, detail=str(exc))',
           '            return Outcome("expired", relist=False, level=logging.INFO, detail=str(exc))',
           "a 410 ERROR event resumes instead of relisting"),
    Mutant("cluster", "app/cluster/informer.py", "            self.resource_version = None  # a break may have lost events: relist, never resume",
           "            pass", "a broken watch resumes instead of relisting"),
    Mutant("cluster", "app/cluster/migrations.py", "    if m.evacuation_node:  # KubeVirt < 1.7: an evacuation; descheduler or drain cannot be told apart\n        return DRAIN",
           "    if m.evacuation_node:  # KubeVirt < 1.7: an evacuation; descheduler or drain cannot be told apart\n        return UNKNOWN",
           "an old-KubeVirt evacuation counted as unknown"),
    Mutant("cluster", "app/cluster/fresh.py", "        return self.fresh.get((namespace, name)) or self.base.vmi(namespace, name)",
           "        return self.base.vmi(namespace, name)", "the fresh read is ignored"),
    # ---- app/effects
    Mutant("effects", "app/effects/events.py", "            self.recorder._confirmed(self, False)\n            log.info(",
           "            self.recorder._confirmed(self, True)\n            log.info(",
           "EvictionAllowed written though no migration followed"),
    Mutant("effects", "app/effects/annotate.py", "    if not pod.ready:\n        return \"pod is not ready\"\n", "",
           "an unready pod gets the annotation"),
    Mutant("effects", "app/effects/annotate.py", "    if vmi.node != pod.node:", "    if False:",
           "a target pod gets the annotation"),
    Mutant("effects", "app/effects/queue.py", "            if entry.attempt >= self.max_attempts:",
           "            if entry.attempt > self.max_attempts:", "one retry too many"),
    Mutant("effects", "app/effects/history.py", "    kept = sorted((e for e in union.values() if e.end >= horizon),",
           "    kept = sorted((e for e in union.values()),", "the history keeps entries out of the window"),
    Mutant("effects", "app/effects/history.py", "    return kept, any(e.identity not in had for e in kept)",
           "    return kept, True", "the history is written even when nothing is new"),
    # ---- app/admission
    Mutant("admission", "app/admission/server.py",
           '            return Decision(allowed=True, reason="internal_error", message="guard error; failing open")',
           '            return Decision(allowed=False, reason="internal_error", message="guard error; failing closed")',
           "a policy exception fails closed"),
    Mutant("admission", "app/admission/review.py", '            "code": 429,', '            "code": 403,',
           "a denial is 403, not 429"),
    Mutant("admission", "app/admission/review.py", '        or _has_all(_dict(obj, "deleteOptions").get("dryRun"))\n', "",
           "the Eviction's deleteOptions.dryRun is missed"),
    # ---- app/transport
    Mutant("transport", "app/transport/http.py",
           "        if len(self.body) + len(body) > self.limits.max_body_bytes:",
           "        if len(self.body) + len(body) > self.limits.max_body_bytes + 1:", "a body one byte over the limit is taken"),
    Mutant("transport", "app/transport/http.py", "        self.overhead += len(piece) - self.piece_body\n",
           "        self.overhead = len(piece) - self.piece_body\n", "a head is charged per read, not per request"),
    Mutant("admission", "app/admission/server.py", "        if decision.allowed and decision.budget_node and ctx.fresh_view is not None:",
           "        if False:", "rule 8 is never read again before an allow"),
]


def run(mutant: Mutant, full: bool) -> tuple[bool, float, str]:
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        tree = Path(tmp)
        subprocess.run(f"git -C {ROOT} archive HEAD | tar -x -C {tree}", shell=True, check=True)
        path = tree / mutant.path
        text = path.read_text()
        if text.count(mutant.old) != 1:
            raise SystemExit(f"{mutant.path}: the mutant's line is not there exactly once: {mutant.old!r}")
        path.write_text(text.replace(mutant.old, mutant.new))
        tests = [] if full else TESTS[mutant.package]
        started = time.monotonic()
        r = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                            "-m", "not e2e", *tests], cwd=tree, capture_output=True, text=True)
        took = time.monotonic() - started
        failed = [line for line in r.stdout.splitlines() if line.startswith(("FAILED tests/", "ERROR tests/"))]
        return r.returncode != 0, took, failed[0] if failed else r.stdout.strip().splitlines()[-1:][0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help="run the mutants whose description or path contains this")
    p.add_argument("--full", action="store_true", help="the whole suite per mutant, not the package's tests")
    args = p.parse_args()
    chosen = [m for m in MUTANTS if args.only in m.what or args.only in m.path]
    killed = 0
    for m in chosen:
        dead, took, why = run(m, args.full)
        killed += dead
        print(f"{'killed ' if dead else 'SURVIVED'} {took:6.0f}s  {m.path}: {m.what}  [{why}]", flush=True)
    print(f"{killed}/{len(chosen)} killed ({100 * killed / max(len(chosen), 1):.0f}%)")
    return 0 if killed == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
