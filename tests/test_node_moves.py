"""The store's per-node index of finished moves, which rules 8b and 8c read (newest first, bounded)."""

from __future__ import annotations

from app.cluster.store import MOVES_KEPT, ClusterStore
from app.domain.kinds import VMIM
from app.domain.records import migration_from_object
from tests.builders import mstate, vmim


def move(name: str, src: str, dst: str, end: float, phase: str = "Succeeded"):
    return migration_from_object(vmim(name, f"vm-{name}", phase, end + 3,
                                      mstate(name, src, dst, end + 2, end, failed=phase == "Failed"),
                                      priority="system-maintenance"))


def names(ms) -> list[str]:
    return [m.name for m in ms]


def test_succeeded_moves_are_indexed_by_source_and_target_newest_first() -> None:
    s = ClusterStore()
    s.upsert(move("old", "a", "b", end=30))  # ends in minutes ago
    s.upsert(move("new", "a", "c", end=5))
    s.upsert(move("failed", "a", "b", end=1, phase="Failed"))  # the VM did not leave
    assert names(s.moves_from("a")) == ["new", "old"]
    assert names(s.moves_to("b")) == ["old"] and names(s.moves_to("c")) == ["new"]
    assert s.moves_from("b") == ()


def test_a_running_vmim_turning_succeeded_enters_the_index_once() -> None:
    s = ClusterStore()
    s.upsert(migration_from_object(vmim("m", "vm-m", "Running", 5, mstate("m", "a", "b", 4))))
    assert s.moves_from("a") == ()
    s.upsert(move("m", "a", "b", end=2))
    s.upsert(move("m", "a", "b", end=2))  # a repeated event
    assert names(s.moves_from("a")) == ["m"] and names(s.moves_to("b")) == ["m"]


def test_delete_and_replace_keep_the_index_right() -> None:
    s = ClusterStore()
    s.upsert(move("x", "a", "b", end=10))
    s.upsert(move("y", "a", "b", end=5))
    s.delete(VMIM, ("vms", "x"))
    assert names(s.moves_from("a")) == ["y"] and names(s.moves_to("b")) == ["y"]
    s.replace(VMIM, [move("z", "c", "a", end=3)])
    assert s.moves_from("a") == () and names(s.moves_to("a")) == ["z"] and names(s.moves_from("c")) == ["z"]


def test_the_index_keeps_the_newest_few_per_node() -> None:
    s = ClusterStore()
    for i in range(MOVES_KEPT + 5):
        s.upsert(move(f"m{i:02d}", "a", f"t{i}", end=i))  # minutes ago: m00 is the newest
    kept = s.moves_from("a")
    assert len(kept) == MOVES_KEPT and kept[0].name == "m00" and kept[-1].name == f"m{MOVES_KEPT - 1:02d}"
