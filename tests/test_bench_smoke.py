"""The bench harness end to end on a tiny cluster: it must produce well-formed results.

Nothing here is timed: performance is what ``make bench`` measures; this only
keeps the harness working (state, the mixes' bodies, the servers, both load
modes, the decisions per mix, the JSON it writes).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench")
    argv = [sys.executable, "-m", "bench.run", "--vmis", "300", "--bodies", "150", "--rounds", "1",
            "--duration", "1", "--rates", "40", "--connections", "4", "--saturation-tool", "python",
            "--mixes", "fixtures,descheduler", "--out", str(out), "--timeout", "150"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=160)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "guard/base" in proc.stdout  # the table was printed
    files = sorted(out.glob("bench-*.json"))
    assert len(files) == 1 and (out / "latest.json").read_bytes() == files[0].read_bytes()
    return orjson.loads(files[0].read_bytes())


def test_every_run_was_answered_by_the_right_server(result: dict) -> None:
    runs = result["runs"]
    assert {(r["mix"], r["target"], r["phase"]) for r in runs} == {
        ("fixtures", "guard", "saturation"), ("fixtures", "baseline", "saturation"), ("fixtures", "stack", "saturation"),
        ("fixtures", "floor", "saturation"), ("fixtures", "guard", "40"), ("fixtures", "baseline", "40"),
        ("descheduler", "guard", "saturation"), ("descheduler", "baseline", "saturation"),
        ("descheduler", "guard", "40"), ("descheduler", "baseline", "40")}
    for r in runs:
        assert r["completed"] > 0, r
        assert set(r["status"]) == {"200"}, r
        assert r["errors"] == {}, r
        lat = r["latency_ms"]
        assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"], r
        assert r["server_cpu_s"] >= 0 and r["rss_mb"] > 0
    fixed = [r for r in runs if r["phase"] == "40"]
    assert all(r["mode"] == "open" and r["offered_rps"] == 40 for r in fixed)
    assert all(r["send_lag_ms"]["p50"] >= 0 for r in fixed)
    # the references answer every body "allowed"; the guard denies some, and the baseline the same ones
    assert all(r["denied"] == 0 for r in runs if r["target"] in ("stack", "floor")), runs
    for mix in ("fixtures", "descheduler"):
        denied = {t: sum(r["denied"] for r in runs if r["mix"] == mix and r["target"] == t and r["phase"] == "40")
                  for t in ("guard", "baseline")}
        assert denied["guard"] > 0 and denied["baseline"] > 0, (mix, denied)


def test_the_fixtures_mix_crosses_the_decision_table_and_the_descheduler_mix_is_mostly_allowed(result: dict) -> None:
    mix = result["mixes"]["fixtures"]["decision_mix"]
    assert math.isclose(sum(mix.values()), 1.0, abs_tol=0.01), mix
    reasons = {k.split(":")[1] for k in mix}
    assert {"allowed", "not_a_vm_pod", "migration_in_progress", "migration_target"} <= reasons, mix
    assert any(k.startswith("denied:") for k in mix) and any(k.startswith("allowed:") for k in mix), mix
    mix = result["mixes"]["descheduler"]["decision_mix"]
    assert mix.get("allowed:allowed", 0) > 0.5 and set(mix) <= {"allowed:allowed", "denied:cooldown"}, mix


def test_summary_has_both_servers_ratios_and_targets(result: dict) -> None:
    assert set(result["mixes"]) == {"fixtures", "descheduler"}, list(result["mixes"])
    assert result["mixes"]["descheduler"]["summary"]["stack"]["saturation_rps"] is None  # references: first mix only
    s = result["mixes"]["fixtures"]["summary"]
    for target in ("guard", "baseline"):
        t = s[target]
        assert t["saturation_rps"] > 0 and t["rss_mb"] > 0 and t["peak_rss_mb"] >= t["rss_mb"] * 0.5
        assert set(t["at_40"]) >= {"p50", "p90", "p99", "max", "achieved_rps"}
    assert s["floor"]["saturation_rps"] > 0 and s["ratios"]["throughput_guard_vs_floor"] > 0
    assert s["stack"]["saturation_rps"] > 0 and s["ratios"]["throughput_guard_vs_stack"] > 0
    assert s["ratios"]["throughput_median_of_rounds"] > 0 and s["ratios"]["cpu_per_request_median_of_rounds"] > 0
    assert s["ratios"]["throughput"] > 0 and s["ratios"]["p99_at_40"] > 0
    table = result["mixes"]["fixtures"]["table_markdown"]
    assert table.count("\n") >= 10 and "guard/baseline" in table, table
    assert result["meta"]["versions"]["uvicorn"]
    # the baseline is plain uvicorn serving bench.plain, not the guard's own serve
    assert "uvicorn" in result["meta"]["baseline_argv"] and "bench.plain:app" in result["meta"]["baseline_argv"]
    assert set(s["targets"]) == {"throughput_ratio", "p99_ratio_at_40", "p99_ratio_at_40_median_of_rounds",
                                 "decide_median_us", "guard_rss_mb"}
    for t in s["targets"].values():
        assert isinstance(t["met"], bool) and t["value"] is not None
    d = result["mixes"]["fixtures"]["decide"]
    assert d["calls"] == 3 * 150 and 0 < d["median_us"] <= d["p99_us"], d
    assert d["loaded"]["vmi"] == 300
    assert result["state"]["objects"]["VirtualMachineInstance"] == 300


def test_the_doc_sections_are_written_from_the_result_files(result: dict, tmp_path: Path) -> None:
    """Every number in docs/performance.md's generated sections comes from a result file (bench.doc)."""
    from bench import doc

    page = tmp_path / "performance.md"
    page.write_text("# P\n\nbefore\n<!-- bench:begin -->\nSTALE-TEXT\n<!-- bench:end -->\nmiddle\n"
                    "<!-- watch:begin -->\nSTALE-TEXT\n<!-- watch:end -->\nafter\n")
    bench_file = tmp_path / "bench.json"
    bench_file.write_bytes(orjson.dumps(result))
    watch = {"vmis": 1000, "pods": 1000, "vmims": 5000, "objects": {"vmi": 1000, "pod": 1000, "vmim": 5000, "node": 4},
             "ready_seconds": 1.25, "ready_cpu_seconds": 0.75, "rss_after_sync_mb": 123, "rss_baseline_mb": 50,
             "rss_after_gc_mb": 120, "state_bytes_per_object": 481, "burst_events_per_second": 23456,
             "live_events_per_second": 12345,
             "floor": {"list_seconds": 0.5, "orjson_decode_cpu_seconds": 0.25, "msgspec_names_cpu_seconds": 0.125,
                       "rss_mb": 100, "rss_baseline_mb": 50, "burst_events_per_second": 46912},
             "vs_floor": {"ready": 2.5, "rss": 1.23, "burst": 2.0},
             "relist": [{"collector": "running", "relist_s": 1.5, "idle": {"p99_ms": 0.1, "max_ms": 0.5},
                         "during": {"p50_ms": 0.2, "p99_ms": 7.5, "max_ms": 20.0}, "rss_mb": 130}],
             "targets_met": {"ready_le_20s": True, "rss_le_350mb": True, "events_ge_30000_per_s": False}}
    watch_file = tmp_path / "watch.json"
    watch_file.write_bytes(orjson.dumps(watch))
    assert doc.main([str(bench_file), "--watch", str(watch_file), "--doc", str(page)]) == 0
    text = page.read_text()
    assert "STALE-TEXT" not in text and text.startswith("# P\n\nbefore\n") and text.endswith("\nafter\n")
    for mix, m in result["mixes"].items():
        assert f"| {mix} |" in text and f"{m['summary']['ratios']['throughput']:.2f}" in text, (mix, text)
    assert "| 1.2 s (0.8 s of CPU) | 0.5 s | 2.50x | <= 20 s (met) |" in text, text
    assert "23,456 (live: 12,345) | 46,912 | 2.00x slower | >= 30,000 (missed) |" in text, text
    assert "about 481 bytes per object (7,004 objects)" in text, text
    assert "| collector running | 1.5 s | 0.10 ms / 0.5 ms | 0.20 ms | 7.5 ms | 20.0 ms | 130 MB |" in text, text


def test_the_reliability_sections_are_written_from_the_figures(tmp_path: Path) -> None:
    from bench import doc

    phase = {"requests": 100, "errors": 0, "cache_stale_answers": 7, "latency_ms_p50": 1.0, "latency_ms_p99": 4.5,
             "latency_ms_max": 12.0, "watch_restarts": {"connection": 2}}
    faults = {"watch_cuts": {**phase, "cuts": 5, "change_seen_after_s_max": 0.5},
              "expired_410": {**phase, "compactions": 6, "change_seen_after_s_max": 0.02},
              "http_500": {**phase, "recovery_s": 1.26}, "http_429": {**phase, "recovery_s": 2.5},
              "api_down": {**phase, "outage_s": 3.5, "recovery_s": 1.0, "latency_ms_p99": 9.25},
              "silent_watch": {**phase, "change_seen_after_s": 1.6},
              "many_cycles": {**phase, "cycles": 30, "rss_mb_before": 99.2, "rss_mb_after": 99.4, "threads": [10, 10],
                              "fds": [19, 18]}}
    figures = tmp_path / "reliability"
    figures.mkdir()
    (figures / "api-faults.json").write_bytes(orjson.dumps(faults))
    (figures / "replicas.json").write_bytes(orjson.dumps({"requests_compared": 180, "identical": 179,
                                                          "one_replica_only_evictions": 19, "restart_to_ready_s": 1.52}))
    page = tmp_path / "reliability.md"
    page.write_text("a\n<!-- faults:begin -->\nSTALE-TEXT\n<!-- faults:end -->\nb\n"
                    "<!-- replicas:begin -->\nSTALE-TEXT\n<!-- replicas:end -->\nc\n")
    assert doc.main(["--reliability", str(figures), "--doc", str(page)]) == 0
    text = page.read_text()
    assert "STALE-TEXT" not in text and text.startswith("a\n") and text.endswith("\nc\n")
    assert "| 500 on every list/watch for 3.5 s | 100 | 0 | 7 | 1.26 s | connection 2 |" in text
    assert "p99 ≤ 9.2 ms in every phase" in text and "RSS went from 99.2 to 99.4 MB" in text
    assert "179 of 180 answers were identical" in text and "ready again 1.5 s after its restart" in text
