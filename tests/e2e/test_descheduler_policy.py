"""The outcome run's DeschedulerPolicy is read in full by the pinned descheduler, and a policy it would read only in
part is refused before a run (``tests/e2e/outcome/policycheck.py``, ``e2e/policycheck``).

The descheduler decodes its policy leniently: ``preEvictionFilter`` (for its ``preevictionfilter``) is dropped without
a word and the profile then runs without that extension point. The check decodes strictly against the descheduler's
own types and loads the policy as the descheduler does."""

from __future__ import annotations

import copy

import pytest
import yaml

from app.sim.scenario import DeschedulerSettings
from tests.e2e.outcome.descheduler import policy, settings_from_policy
from tests.e2e.outcome.policycheck import PolicyRejected, check_policy


@pytest.mark.timeout(900)
@pytest.mark.check("descheduler policy read in full")
def test_the_outcome_policy_is_read_in_full_and_a_policy_read_in_part_is_refused(binaries, tmp_path, detail):
    doc = policy("http://127.0.0.1:9090", DeschedulerSettings())
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(doc))
    check_policy(path)  # every key of the policy the outcome run writes
    assert settings_from_policy(doc, DeschedulerSettings(interval=7)) == DeschedulerSettings(interval=7)

    refused = {}
    # the key the run used to write: camel case where the type says preevictionfilter
    misspelt = copy.deepcopy(doc)
    plugins = misspelt["profiles"][0]["plugins"]
    plugins["preEvictionFilter"] = plugins.pop("preevictionfilter")
    # a limit where the type has none (it belongs to the policy's top level, not the profile)
    misplaced = copy.deepcopy(doc)
    misplaced["profiles"][0]["maxNoOfPodsToEvictPerNode"] = 1
    # a plugin arg LowNodeUtilization's args do not have
    bad_arg = copy.deepcopy(doc)
    bad_arg["profiles"][0]["pluginConfig"][1]["args"]["evictionLimit"] = {"node": 1}
    for name, bad in (("preEvictionFilter", misspelt), ("maxNoOfPodsToEvictPerNode", misplaced),
                      ("evictionLimit", bad_arg)):
        p = tmp_path / f"{name}.yaml"
        p.write_text(yaml.safe_dump(bad))
        with pytest.raises(PolicyRejected, match=name) as e:
            check_policy(p)
        refused[name] = str(e.value).splitlines()[0][-160:]
    # the pluggable mode's structure-only check still reads the policy's own keys strictly
    with pytest.raises(PolicyRejected, match="preEvictionFilter"):
        check_policy(tmp_path / "preEvictionFilter.yaml", structure_only=True)
    detail["detail"] = f"the outcome policy is read in full; refused: {refused}"
