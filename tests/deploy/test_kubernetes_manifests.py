"""deploy/kubernetes: every kustomization renders with `kubectl kustomize`; `kubernetes-validate --strict`
passes every built-in resource against the Kubernetes 1.37 schemas; the two Prometheus-operator resources it
has no schema for (ServiceMonitor, PrometheusRule) are checked here instead (selector and port against the
rendered Service, rules through promtool and equal to deploy/prometheus/alerts.yml); the captures' command
line, preStop hook and config parse with the real `cdc` parser and config loader; grace period, probes,
volumes, anti-affinity and disruption budgets hang together.

No Kubernetes cluster runs here (no kubelet/kind/k3s/minikube in Debian 12 or PyPI, no image registry), so
the manifests are validated and rendered, not deployed (docs/operations.md, Kubernetes)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc.config import ServerConfig
from cli.main import build_parser

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
KUSTOMIZATIONS = ["base", "overlays/dev", "overlays/production"]
CRDS = {"ServiceMonitor", "PrometheusRule"}
KUBECTL = shutil.which("kubectl")
VALIDATE = Path(sys.executable).parent / "kubernetes-validate"


def _render(name: str) -> list[dict[str, Any]]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed: cannot render the kustomizations (kubectl kustomize)")
    r = subprocess.run([KUBECTL, "kustomize", str(K8S / name)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name)]
    return doc


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_renders_and_validates_against_kubernetes_schemas(name: str, tmp_path: Path) -> None:
    docs = _render(name)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["ConfigMap", "Secret", "Service", "Service", "Service", "StatefulSet", "StatefulSet",
                            "PodDisruptionBudget", "PodDisruptionBudget", "ServiceMonitor", "PrometheusRule"])
    out = tmp_path / "rendered.yaml"
    out.write_text(yaml.safe_dump_all(docs))
    r = subprocess.run([str(VALIDATE), "--strict", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    passed = set(re.findall(r"passed for resource (\S+) against", r.stdout + r.stderr))
    builtins = {f"{d['kind'].lower()}/{d['metadata']['name']}" for d in docs if d["kind"] not in CRDS}
    assert passed == builtins, (passed, builtins)
    unknown = set(re.findall(r"Couldn't find schema for kind (\w+)", r.stdout + r.stderr))
    assert unknown == CRDS  # checked by the tests below instead


def test_validation_can_fail(tmp_path: Path) -> None:
    docs = _render("base")
    sts = _one(docs, "StatefulSet", "tidewater")
    sts["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["porrt"] = 1
    out = tmp_path / "broken.yaml"
    out.write_text(yaml.safe_dump(sts))
    r = subprocess.run([str(VALIDATE), "--strict", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "porrt" in r.stdout + r.stderr


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_captures_command_probes_drain_and_volumes(name: str) -> None:
    docs = _render(name)
    sts = _one(docs, "StatefulSet", "tidewater")
    pod = sts["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"] for e in c.get("env", [])}
    # $(VAR) references are expanded by the kubelet from the container's env: every one must be defined
    refs = {v for a in c["args"] for v in re.findall(r"\$\((\w+)\)", a)}
    assert refs <= env, refs - env
    argv = [re.sub(r"\$\((\w+)\)", "x", a) for a in c["args"]]
    assert c["command"] == ["cdc"]
    args = build_parser().parse_args(argv)  # argparse exits on an unknown flag
    assert args.command == "server"
    help_text = subprocess.run([sys.executable, "-m", "cli", "server", "--help"], capture_output=True, text=True,
                               timeout=60, cwd=ROOT).stdout
    for flag in re.findall(r"(--[a-z-]+)", " ".join(c["args"])):
        assert flag in help_text, flag
    # the config file of the ConfigMap loads under those flags
    cm = _one(docs, "ConfigMap", "tidewater-config")
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == args.config)
    assert mount["subPath"] in cm["data"]
    config = ServerConfig.from_toml(cm["data"][mount["subPath"]], etcd="http://etcd-0.etcd:2379",
                                    addr="10.0.0.1:8300", data_dir=args.data_dir)
    vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    # the sorter's data dir is the per-pod volume
    sorter = next(m for m in c["volumeMounts"] if m["mountPath"] == args.data_dir)
    assert sorter["name"] in {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
    # preStop drains through the real CLI and waits; the grace period covers that wait plus SIGTERM's drain
    hook = c["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["sh", "-c"]
    cli = shlex.split(hook[2].replace("${POD_IP}", "10.0.0.1"))
    assert cli[:2] == ["exec", "cdc"]
    drain = build_parser().parse_args(cli[2:])
    assert (drain.group, drain.op, drain.self) == ("capture", "drain", True)
    assert "POD_IP" in env
    assert pod["terminationGracePeriodSeconds"] > drain.wait + config.drain_timeout
    # separate liveness and readiness endpoints, on the API port
    assert c["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    port = next(p for p in c["ports"] if p["name"] == c["readinessProbe"]["httpGet"]["port"])
    assert args.addr.endswith(f":{port['containerPort']}")
    # spread over nodes; production requires it
    anti = pod["affinity"]["podAntiAffinity"]
    assert anti.get("requiredDuringSchedulingIgnoredDuringExecution" if name.endswith("production")
                    else "preferredDuringSchedulingIgnoredDuringExecution")


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_services_budgets_etcd_and_prometheus_operator_resources(name: str, tmp_path: Path) -> None:
    docs = _render(name)
    sts = _one(docs, "StatefulSet", "tidewater")
    etcd = _one(docs, "StatefulSet", "etcd")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    assert services[sts["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
    assert _matches(services["tidewater"]["spec"]["selector"], pod_labels)
    for pdb in (d for d in docs if d["kind"] == "PodDisruptionBudget"):
        targets = [s for s in (sts, etcd) if _matches(pdb["spec"]["selector"]["matchLabels"],
                                                       s["spec"]["template"]["metadata"]["labels"])]
        assert len(targets) == 1, pdb["metadata"]["name"]
    # etcd: three members named after the StatefulSet and its headless Service
    assert etcd["spec"]["replicas"] == 3 and services[etcd["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
    cmd = " ".join(etcd["spec"]["template"]["spec"]["containers"][0]["command"])
    members = re.search(r"--initial-cluster=(\S+)", cmd)
    assert members and members.group(1).count(f".{etcd['spec']['serviceName']}:2380") == 3
    endpoints = next(e["value"] for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]
                     if e["name"] == "ETCD_ENDPOINTS")
    assert endpoints.count(f".{etcd['spec']['serviceName']}:2379") == 3
    # ServiceMonitor (no schema in kubernetes-validate): selects one Service, by a port it has, at /metrics
    sm = _one(docs, "ServiceMonitor", "tidewater")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    picked = [s for s in services.values() if _matches(sm["spec"]["selector"]["matchLabels"],
                                                       s["metadata"]["labels"])]
    assert [s["metadata"]["name"] for s in picked] == ["tidewater-peers"]
    (ep,) = sm["spec"]["endpoints"]
    assert ep["path"] == "/metrics" and ep["port"] in {p["name"] for p in picked[0]["spec"]["ports"]}
    assert sm["metadata"].get("namespace") == sts["metadata"].get("namespace")
    # PrometheusRule (no schema either): the shipped rules, and promtool accepts them
    rule = _one(docs, "PrometheusRule", "tidewater")
    shipped = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())["groups"]
    assert rule["spec"]["groups"] == shipped
    if name.endswith("production"):
        assert rule["metadata"]["labels"]["release"] == "prometheus" == sm["metadata"]["labels"]["release"]
    promtool = shutil.which("promtool")
    if promtool is not None:  # else test_prometheus_rules.py reports the missing tool
        f = tmp_path / "rules.yml"
        f.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
        r = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


def test_prometheusrule_is_generated_from_alerts() -> None:
    r = subprocess.run([sys.executable, str(K8S / "sync_rules.py"), "--check"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
