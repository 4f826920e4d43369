"""Issue 14 item 6: the Kubernetes manifests pass the Kubernetes schema (kubernetes-validate,
strict: unknown fields fail) and say what docs/deploy.md promises; the compose file wires
the hub to its Redis. No cluster and no Docker engine are needed."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30.0"


def docs() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            out.append((path.name, doc))
    return out


def by_kind(kind: str) -> dict:
    (doc,) = [d for _, d in docs() if d["kind"] == kind]
    return doc


@pytest.mark.parametrize(("name", "doc"), docs(), ids=[f"{n}:{d['kind']}" for n, d in docs()])
def test_manifest_matches_the_kubernetes_schema(name: str, doc: dict) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_schema_check_can_fail() -> None:
    doc = by_kind("Deployment")
    container = doc["spec"]["template"]["spec"]["containers"][0]
    container["readinessProb"] = container.pop("readinessProbe")  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_deployment_probes_drain_and_budget() -> None:
    deployment = by_kind("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (hub,) = pod["containers"]
    assert hub["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert hub["livenessProbe"]["httpGet"]["path"] == "/livez"
    # an overloaded hub answers late; a restart would carry its load to the other pods
    live = hub["livenessProbe"]
    assert live["timeoutSeconds"] >= 10, live
    assert live["periodSeconds"] * live["failureThreshold"] >= 60, live
    pre_stop_s = int(hub["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pre_stop_s >= 5
    env = {e["name"]: e.get("value") for e in hub["env"]}
    grace_s = float(env["DESKBRIDGE_GRACE_S"])
    # Kubernetes kills the pod after terminationGracePeriodSeconds, preStop included.
    assert pod["terminationGracePeriodSeconds"] >= pre_stop_s + grace_s + 5
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    pdb = by_kind("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert by_kind("Service")["spec"]["selector"].items() <= labels.items()
    secret_keys = set(by_kind("Secret")["stringData"])
    assert {"DESKBRIDGE_REDIS_URL", "DESKBRIDGE_SECRET", "DESKBRIDGE_API_KEY"} <= secret_keys


def test_compose_wires_the_hub_to_redis() -> None:
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    hub = compose["services"]["hub"]
    assert hub["environment"]["DESKBRIDGE_REDIS_URL"].startswith("redis://redis:")
    assert "redis" in compose["services"]
    assert hub["depends_on"]["redis"]["condition"] == "service_healthy"
    assert (ROOT / "deploy" / hub["build"]["context"] / hub["build"]["dockerfile"]).is_file()


def test_the_example_secret_cannot_run_a_hub_as_it_stands() -> None:
    # ``kubectl apply -f deploy/k8s/`` applies secret.example.yaml too: its placeholders
    # ("replace-with-32-or-more-random-bytes-in-hex", 43 bytes, and "replace-me") passed
    # every check of ``serve``, so three pods served on 0.0.0.0 signing tokens with a
    # secret printed in the repository. Each placeholder must be one the hub refuses.
    from deskbridge_hub._config import HubConfig
    from deskbridge_hub._tokens import check_secret

    env = by_kind("Secret")["stringData"]
    hub = HubConfig.from_env(env)
    if hub.secrets:
        with pytest.raises(ValueError, match="DESKBRIDGE_SECRET"):
            check_secret(hub.secrets[0])
    # an empty key list makes ``serve --bind 0.0.0.0:8080`` refuse to start
    assert hub.api_keys == ()


def test_every_variable_the_deploy_files_set_is_one_the_hub_reads() -> None:
    # a misspelt name in a manifest is only a WARNING in the pod's log
    from deskbridge_common._envnames import KNOWN

    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    names = set(compose["services"]["hub"]["environment"])
    names |= set(by_kind("Secret")["stringData"])
    (hub,) = by_kind("Deployment")["spec"]["template"]["spec"]["containers"]
    names |= {e["name"] for e in hub["env"]}
    assert names and names <= set(KNOWN), names - set(KNOWN)
