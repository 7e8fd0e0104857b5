"""Known vulnerabilities in the image's pinned dependencies (constraints.txt), by pip-audit.

pip-audit asks PyPI's JSON API for each pinned release's advisories. Where that API cannot be reached (a mirror
that serves only the package index, no network), every dependency comes back skipped: this says so in one line and
passes, since nothing was audited. A vulnerability found fails the run.

    python .ci/audit.py [constraints.txt]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    pins = sys.argv[1] if len(sys.argv) > 1 else "constraints.txt"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "audit.json"
        run = subprocess.run([sys.executable, "-m", "pip_audit", "-r", pins, "--require-hashes", "--disable-pip",
                              "--no-deps", "--progress-spinner", "off", "--format", "json", "--output", str(out)],
                             capture_output=True, text=True)
        if not out.exists():
            last = (run.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"pip-audit: the vulnerability database is not reachable from here ({last}); nothing audited")
            return 0
        report = json.loads(out.read_text())
    deps = report.get("dependencies", [])
    audited = [d for d in deps if "skip_reason" not in d]
    if not audited:
        reason = deps[0]["skip_reason"] if deps else "no dependencies read"
        print(f"pip-audit: the vulnerability database is not reachable from here (all {len(deps)} pins skipped: "
              f"{reason}); nothing audited")
        return 0
    found = [(d["name"], d["version"], v["id"], ",".join(v.get("fix_versions", [])) or "none")
             for d in audited for v in d.get("vulns", [])]
    skipped = len(deps) - len(audited)
    for name, version, vuln, fixed in found:
        print(f"pip-audit: {name} {version}: {vuln} (fixed in: {fixed})")
    print(f"pip-audit: {len(audited)} pins audited, {skipped} skipped, {len(found)} known vulnerabilities")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
