"""``kubevirt-eviction-guard unregister``: the chart's uninstall hook deletes exactly one webhook configuration, by
name, against an API server over HTTP (the fake: faults on demand)."""

from __future__ import annotations

import pytest

from app.backoff import Backoff
from app.cli import main
from app.cluster.unregister import UnregisterError, delete_webhook_configuration
from tests.fakeapi import FakeApiServer
from tests.fakeapi.resources import MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS

NAME = "guard-kubevirt-eviction-guard"


def webhook_configuration(kind: str, name: str = NAME) -> dict:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": f"{kind}WebhookConfiguration",
            "metadata": {"name": name}, "webhooks": []}


class Clock:
    """A clock that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def api():
    with FakeApiServer() as fake:
        yield fake


def client_of(fake: FakeApiServer):
    from kubernetes import client

    cfg = fake.configuration()
    cfg.retries = False
    return client.ApiClient(cfg)


@pytest.mark.parametrize(("kind", "resource"), [("mutating", MUTATING_WEBHOOKS), ("validating", VALIDATING_WEBHOOKS)])
def test_deletes_exactly_the_named_webhook_configuration(api, kind, resource):
    api.put(webhook_configuration(kind.capitalize()))
    api.put(webhook_configuration(kind.capitalize(), "someone-elses"))
    other = "validating" if kind == "mutating" else "mutating"
    api.put(webhook_configuration(other.capitalize()))
    assert delete_webhook_configuration(client_of(api), kind, NAME, timeout=5) == "deleted"
    assert [o["metadata"]["name"] for o in api.objects(resource)] == ["someone-elses"]
    assert len(api.objects(MUTATING_WEBHOOKS if other == "mutating" else VALIDATING_WEBHOOKS)) == 1
    deletes = [r for r in api.requests if r.method == "DELETE"]
    assert [r.path for r in deletes] == [f"/apis/admissionregistration.k8s.io/v1/{resource.plural}/{NAME}"]


def test_already_gone_is_success(api):
    assert delete_webhook_configuration(client_of(api), "mutating", NAME, timeout=5) == "absent"


def test_retries_what_can_pass_on_its_own(api):
    """403 (the hook's RoleBinding not yet seen by the authorizer), 429, 503, then it goes through."""
    api.put(webhook_configuration("Mutating"))
    for status in (403, 429, 503):
        api.fail(status, times=1, kind=MUTATING_WEBHOOKS, verbs=["delete"])
    clock = Clock()
    assert delete_webhook_configuration(client_of(api), "mutating", NAME, timeout=30, clock=clock,
                                        sleep=clock.sleep) == "deleted"
    assert len(clock.sleeps) == 3 and api.objects(MUTATING_WEBHOOKS) == []


def test_gives_up_at_its_deadline_naming_the_last_answer(api):
    api.put(webhook_configuration("Mutating"))
    api.fail(403, times=-1, kind=MUTATING_WEBHOOKS, verbs=["delete"])
    clock = Clock()
    with pytest.raises(UnregisterError, match=r"not deleted after \d+ attempts in 20 s; last answer: HTTP 403"):
        delete_webhook_configuration(client_of(api), "mutating", NAME, timeout=20, clock=clock, sleep=clock.sleep,
                                     backoff=Backoff(base=1, cap=4))
    assert clock.now < 20 and len(clock.sleeps) >= 4
    assert len(api.objects(MUTATING_WEBHOOKS)) == 1


def test_an_answer_no_retry_changes_ends_at_once(api):
    api.fail(401, times=-1, kind=MUTATING_WEBHOOKS, verbs=["delete"])
    clock = Clock()
    with pytest.raises(UnregisterError, match="HTTP 401"):
        delete_webhook_configuration(client_of(api), "mutating", NAME, timeout=30, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == []


def test_an_unreachable_api_server_is_retried_until_the_deadline(api):
    cfg_client = client_of(api)
    api.down()
    clock = Clock()
    with pytest.raises(UnregisterError, match="last answer: .*(Error|refused)"):
        delete_webhook_configuration(cfg_client, "mutating", NAME, timeout=10, clock=clock, sleep=clock.sleep)
    assert clock.sleeps


def test_command_line(api, tmp_path, capsys):
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    api.put(webhook_configuration("Validating"))
    args = ["unregister", "--kind", "validating", "--name", NAME, "--kubeconfig", str(kubeconfig)]
    assert main(args) == 0
    assert capsys.readouterr().out == f"validatingwebhookconfiguration {NAME}: deleted\n"
    assert main(args) == 0
    assert capsys.readouterr().out == f"validatingwebhookconfiguration {NAME}: already gone\n"
    api.put(webhook_configuration("Validating"))
    api.fail(500, times=-1, kind=VALIDATING_WEBHOOKS, verbs=["delete"])
    assert main([*args[:-2], "--timeout", "1", "--kubeconfig", str(kubeconfig)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kubevirt-eviction-guard: validatingwebhookconfiguration") and "HTTP 500" in err


@pytest.mark.parametrize("bad", [["--name", "Not_A_Name"], ["--name", "x", "--kind", "both"],
                                 ["--name", "x", "--timeout", "0"]])
def test_command_line_refusals(bad, capsys):
    args = ["unregister", "--kind", "mutating", *bad]
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2 and "unregister" in capsys.readouterr().err
