"""The config's placement as Kubernetes objects (runtime/launch/clusters/kubernetes_objects.py),
validated offline against the Kubernetes API's schemas, and applied by kubectl (kubectl.py).

No cluster is reachable here: what is checked is what the objects say (against the
schemas of ``K8S``, strictly: a misspelled field or a kind without a schema fails), the
start script under a real ``sh``, the pods' command lines under asyncrl's own parser,
and what ``asyncrl launch`` hands to ``kubectl`` (a stand-in program on PATH that
records it, in place of a cluster's)."""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from asyncrl.runtime.contract.config import config_from_dict, load_config
from asyncrl.runtime.launch.cli.main import build_parser, main
from asyncrl.runtime.launch.clusters.kubectl import (
    launch_on_kubernetes,
    manifests_path,
    new_run_keys,
)
from asyncrl.runtime.launch.clusters.kubernetes_objects import (
    KEY_FILES,
    KEYS_DIR,
    keys_secret,
    manifests_text,
    render_manifests,
)
from asyncrl.transport.identity import load_run_secret
from asyncrl.transport.security import load_client_keys, load_server_keys

K8S = "1.30.0"  # the oldest Kubernetes the manifests are meant for
K8S_SETTINGS = {"image": "registry.example.com/asyncrl:1", "run_claim": "runs",
                "namespace": "ml", "journal_storage_class": "fast-ssd"}  # fmt: skip
# The scheduler with the CPU roles; the trainer's group of 2 ranks and logp; 2 generator nodes.
NODES = [
    {"roles": {"scheduler": 1, "dataloader": 1, "reward": 1}},
    {"roles": {"train": 2, "logp": 1}},
    {"count": 2, "roles": {"generate": 2}},
]


def _settings(nodes: list[dict[str, Any]] = NODES, **more: Any) -> dict[str, Any]:
    return {
        "scheduler": {"host": "0.0.0.0"},
        "pipeline": {"workers": {"train": 2}},
        "backends": {"device": "cuda"},
        "placement": {"nodes": nodes, "kubernetes": {**K8S_SETTINGS, **more}},
    }


def _validate(obj: dict[str, Any]) -> None:
    """Against ``K8S``'s schemas, strictly (unknown fields refused). A kind with no schema
    raises SchemaNotFoundError here (kubernetes-validate's command line only warns)."""
    kubernetes_validate.validate(obj, K8S, strict=True)


def _by_name(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in objects}


def _container(obj: dict[str, Any]) -> dict[str, Any]:
    (container,) = obj["spec"]["template"]["spec"]["containers"]
    return container


def _node(command: list[str]) -> list[str]:
    """The arguments of the pod's ``asyncrl`` (after its start script's)."""
    return command[command.index("asyncrl") + 1 :]


def test_the_dry_run_prints_manifests_that_validate_against_the_schemas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(_settings()))
    assert main(["launch", "--on", "kubernetes", "-c", str(config), "--dry-run"]) == 0
    out = capsys.readouterr().out
    objects = list(yaml.safe_load_all(out))
    for obj in objects:
        _validate(obj)
    assert [o["kind"] for o in objects] == [
        "ConfigMap", "Service", "NetworkPolicy", "StatefulSet", "StatefulSet", "Deployment",
        "Deployment",
    ]  # fmt: skip
    # No key in what is printed: the Secret is made only when applying.
    assert "Secret" not in [o["kind"] for o in objects] and "secret-key" not in out
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing


def test_a_kind_without_a_schema_or_a_misspelled_field_fails_validation() -> None:
    objects = render_manifests(config_from_dict(_settings()))
    # A kind of an add-on (LeaderWorkerSet): no schema here.
    unknown = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
               "metadata": {"name": "trainer"}, "spec": {}}  # fmt: skip
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        _validate(unknown)
    misspelled = copy.deepcopy(objects[4])
    container = _container(misspelled)
    container["resource"] = container.pop("resources")
    with pytest.raises(kubernetes_validate.ValidationError, match="'resource' was unexpected"):
        _validate(misspelled)
    wrong_type = copy.deepcopy(objects[3])
    wrong_type["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(wrong_type)


def test_each_pod_runs_its_nodes_asyncrl_node_workers_dialling_the_schedulers_service() -> None:
    objects = _by_name(render_manifests(config_from_dict(_settings())))
    parser = build_parser()
    scheduler = objects["StatefulSet/asyncrl-arithmetic-scheduler"]
    trainer = objects["StatefulSet/asyncrl-arithmetic-node-1"]
    generators = [objects[f"Deployment/asyncrl-arithmetic-node-{i}"] for i in (2, 3)]
    service = objects["Service/asyncrl-arithmetic-scheduler"]
    dial = "tcp://asyncrl-arithmetic-scheduler.ml.svc:5555"
    for obj, roles, first, gpus, dials in [
        (trainer, "train=2,logp=1", 0, 3, dial),
        (generators[0], "generate=2", 0, 2, dial),
        (generators[1], "generate=2", 2, 2, dial),
    ]:
        command = _container(obj)["command"]
        assert command[:2] == ["/bin/sh", "-c"]  # the run secret's private copy first
        args = parser.parse_args(_node(command))  # asyncrl's own parser takes it as it is
        assert (args.roles, args.first_index, args.scheduler) == (roles, first, dials)
        assert args.gpus == ",".join(str(g) for g in range(gpus))
        assert args.overrides == ["payloads.host=$(POD_IP)"]
        assert _container(obj)["resources"] == {"limits": {"nvidia.com/gpu": gpus}}
        assert obj["spec"]["replicas"] == 1
    assert [g["spec"]["strategy"] for g in generators] == [{"type": "Recreate"}] * 2
    assert "volumeClaimTemplates" not in trainer["spec"]
    # The scheduler's node: its own roles, no dial, its journal on its own volume.
    args = parser.parse_args(
        [*_node(_container(scheduler)["command"]), "--resume"]
    )  # as the start script adds it
    assert (args.roles, args.scheduler, args.resume) == ("scheduler,dataloader=1,reward=1", None,
                                                         True)  # fmt: skip
    assert "resources" not in _container(scheduler)  # CPU roles only: no GPU asked for
    (journal,) = scheduler["spec"]["volumeClaimTemplates"]
    assert journal["spec"]["storageClassName"] == "fast-ssd"
    assert journal["spec"]["resources"]["requests"]["storage"] == "10Gi"
    mounts = {m["mountPath"]: m for m in _container(scheduler)["volumeMounts"]}
    # Outside the run claim (linked into the run directory by the start script): a mount
    # inside it would have the container runtime make the run directory, as root.
    assert mounts["/var/lib/asyncrl"]["name"] == "journal"
    assert not [path for path in mounts if path.startswith("/asyncrl/")]
    # The headless Service names the scheduler's pod, on the ports the config fixes.
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == scheduler["spec"]["template"]["metadata"]["labels"]
    assert [p["port"] for p in service["spec"]["ports"]] == [5555, 5556]
    assert scheduler["spec"]["serviceName"] == service["metadata"]["name"]
    for obj in (scheduler, trainer, *generators):
        assert obj["spec"]["template"]["spec"]["restartPolicy"] == "Always"
        assert (
            obj["spec"]["selector"]["matchLabels"] == obj["spec"]["template"]["metadata"]["labels"]
        )


def test_only_the_schedulers_pod_gets_the_schedulers_secret_key() -> None:
    objects = render_manifests(config_from_dict(_settings()))
    items = [
        [item["key"] for v in o["spec"]["template"]["spec"]["volumes"] if "secret" in v
         for item in v["secret"]["items"]]
        for o in objects[3:]
    ]  # fmt: skip
    assert items[0] == list(KEY_FILES)
    assert all("server.key_secret" not in keys and "client.key_secret" in keys
               for keys in items[1:])  # fmt: skip


def test_the_pods_config_is_the_runs_with_the_keys_from_the_secret(tmp_path: Path) -> None:
    cfg = config_from_dict(_settings())
    (config_map,) = [o for o in render_manifests(cfg) if o["kind"] == "ConfigMap"]
    path = tmp_path / "run.yaml"
    path.write_text(config_map["data"]["run.yaml"])
    pods = load_config(path)
    assert pods.scheduler.keys_dir == KEYS_DIR
    assert pods.placement == cfg.placement and pods.pipeline == cfg.pipeline
    assert pods.run.dir == "runs/arithmetic"  # relative: in /asyncrl, the run claim


def _run_start_script(command: list[str], tmp_path: Path, run_dir: Path,
                      kept: Path | None = None) -> str:  # fmt: skip
    """The pod's start script under a real sh, its paths moved into ``tmp_path``, with
    ``echo`` for asyncrl; what it printed. The Secret's file is as fsGroup leaves it."""
    assert command[:2] == ["/bin/sh", "-c"]
    # Kubernetes turns $$ into $ in a command (its escape of $(NAME)); no other $( in it.
    script = command[2].replace("$$", "$")
    assert "$(" not in command[2].replace("$$(", "")
    secret = tmp_path / "keys" / "run.secret"
    secret.parent.mkdir(exist_ok=True)
    secret.write_text("ab" * 32 + "\n")
    secret.chmod(0o440)
    moved = {command[4]: str(secret), command[5]: str(run_dir)}
    if kept is not None:
        moved |= {command[6]: str(run_dir / "endpoints.json"), command[7]: str(run_dir / "journal"),
                  command[8]: str(kept)}  # fmt: skip
    args = [moved.get(arg, arg) for arg in command[4 : command.index("asyncrl")]]
    done = subprocess.run(["/bin/sh", "-c", script, command[3], *args, "echo", "node"],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "HOSTNAME": "pod-0"})  # fmt: skip
    # What the run reads: a copy only this user may read (it refuses the Secret's 0440).
    assert (run_dir / "run.secret").stat().st_mode & 0o777 == 0o600
    assert load_run_secret(run_dir / "run.secret") == bytes.fromhex("ab" * 32)
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".")) == []
    return done.stdout


@pytest.mark.parametrize("journal", [[], ["00000001.log"]])
def test_the_schedulers_pod_resumes_when_its_journal_holds_records(
    tmp_path: Path, journal: list[str]
) -> None:
    cfg = config_from_dict(_settings())
    scheduler = render_manifests(cfg)[3]
    run_dir, kept = tmp_path / "runs" / "a", tmp_path / "journal-volume" / "journal"
    kept.mkdir(parents=True)
    for name in journal:
        (kept / name).write_text("x")
    (run_dir / "journal").mkdir(parents=True)  # the mount point an earlier manifest left
    (run_dir / "endpoints.json").write_text("{}")  # a scheduler's from before the pod restarted
    printed = _run_start_script(_container(scheduler)["command"], tmp_path, run_dir, kept)
    resumed = " --resume" if journal else ""
    assert printed == f"node{resumed}\n"
    assert not (run_dir / "endpoints.json").exists()
    assert (run_dir / "journal").resolve() == kept.resolve()


def test_a_workers_pod_starts_its_node_with_the_run_secret_in_place(tmp_path: Path) -> None:
    generator = render_manifests(config_from_dict(_settings()))[5]
    command = _container(generator)["command"]
    assert _run_start_script(command, tmp_path, tmp_path / "runs" / "a") == "node\n"


def test_every_pod_runs_unprivileged_with_a_bounded_shm_and_only_the_runs_pods_reach_it() -> None:
    cfg = config_from_dict(_settings(run_as_user=4242, run_as_group=4343, shm_size="8Gi"))
    objects = render_manifests(cfg)
    for obj in objects:
        _validate(obj)
    workloads = [o for o in objects if o["kind"] in ("StatefulSet", "Deployment")]
    for obj in workloads:
        pod = obj["spec"]["template"]["spec"]
        assert pod["securityContext"] == {
            "runAsNonRoot": True, "runAsUser": 4242, "runAsGroup": 4343, "fsGroup": 4343,
            "seccompProfile": {"type": "RuntimeDefault"},
        }  # fmt: skip
        assert _container(obj)["securityContext"] == {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}
        }  # fmt: skip
        (shm,) = [v for v in pod["volumes"] if v["name"] == "shm"]
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    run_pods = {"matchLabels": {"app.kubernetes.io/name": "asyncrl",
                                "app.kubernetes.io/instance": "arithmetic"}}  # fmt: skip
    assert policy["spec"] == {"podSelector": run_pods, "policyTypes": ["Ingress"],
                              "ingress": [{"from": [{"podSelector": run_pods}]}]}  # fmt: skip
    assert policy["metadata"]["namespace"] == "ml"
    # The policy's selector takes in every pod of the run, and no other run's.
    for obj in workloads:
        labels = obj["spec"]["template"]["metadata"]["labels"]
        assert run_pods["matchLabels"].items() <= labels.items()
    defaults = config_from_dict(_settings()).placement.kubernetes
    assert (defaults.run_as_user, defaults.shm_size) == (1000, "64Gi")


def test_one_node_is_one_pod_and_its_bus_stays_inside() -> None:
    cfg = config_from_dict({"placement": {"kubernetes": K8S_SETTINGS}})  # loopback: ipc://
    objects = render_manifests(cfg)
    for obj in objects:
        _validate(obj)
    assert [o["kind"] for o in objects] == ["ConfigMap", "Service", "NetworkPolicy", "StatefulSet"]
    assert "ports" not in objects[1]["spec"] and "ports" not in _container(objects[3])
    command = _container(objects[3])["command"]
    assert "--scheduler" not in command
    # Its payloads stay on loopback: a bus without CURVE serves nothing on the pod's address.
    assert not [arg for arg in command if arg.startswith("payloads.host")]


def test_the_keys_secret_validates_and_holds_keys_the_run_loads(tmp_path: Path) -> None:
    cfg = config_from_dict(_settings())
    secret = keys_secret(cfg, new_run_keys())
    _validate(secret)
    assert secret["metadata"] == {
        "name": "asyncrl-arithmetic-keys", "namespace": "ml",
        "labels": {"app.kubernetes.io/name": "asyncrl",
                   "app.kubernetes.io/instance": "arithmetic"},
    }  # fmt: skip
    _load_keys(secret, tmp_path)


def _load_keys(secret: dict[str, Any], directory: Path) -> None:
    """The Secret's files, written as the pod's volume shows them (0400), load."""
    for name, data in secret["data"].items():
        path = directory / name
        path.write_bytes(base64.b64decode(data))
        path.chmod(0o400)
    assert len(load_run_secret(directory / "run.secret")) >= 16
    load_server_keys(directory)
    load_client_keys(directory)


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"image": ""}, "placement.kubernetes.image: none given"),
        ({"run_claim": ""}, "placement.kubernetes.run_claim: none given; allowed: a "
         "ReadWriteMany PersistentVolumeClaim in namespace ml"),
        ({"run": {"dir": "/shared/runs/a"}}, "run.dir: got /shared/runs/a; allowed on "
         "Kubernetes: a relative path inside the run claim"),
        ({"run": {"dir": "../a"}}, "run.dir: got ../a"),
        ({"scheduler": {"host": "10.0.0.5"}}, "scheduler.host: got 10.0.0.5; allowed on "
         "Kubernetes: 0.0.0.0"),
        ({"scheduler": {"host": "0.0.0.0", "control_port": 0}},
         "scheduler.control_port, events_port: got 0, 5556"),
        ({"scheduler": {"host": "0.0.0.0", "events_port": 6000}},
         "scheduler.control_port, events_port: got 5555, 6000"),
        ({"run": {"name": "x" * 31}}, "run.name: got 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'"),
        ({"run": {"name": "__"}}, "run.name: got '__'; allowed on Kubernetes: 1 to 30"),
    ],
)  # fmt: skip
def test_a_run_kubernetes_cannot_go_by_is_refused_with_one_line(settings: dict[str, Any],
                                                               error: str) -> None:  # fmt: skip
    raw = _settings()
    for section, values in settings.items():
        if section in ("image", "run_claim"):
            raw["placement"]["kubernetes"][section] = values
        else:
            raw[section] = {**raw.get(section, {}), **values}
    with pytest.raises(ValueError) as raised:
        manifests_text(config_from_dict(raw))
    assert error in str(raised.value) and "\n" not in str(raised.value)


def test_a_group_split_over_nodes_is_a_statefulset_per_node_running_its_ranks() -> None:
    split = [{"roles": {"scheduler": 1, "dataloader": 1, "reward": 1, "logp": 1}},
             {"count": 2, "roles": {"generate": 1, "train": 1}, "gpus": 2}]  # fmt: skip
    objects = render_manifests(config_from_dict(_settings(split)))
    for obj in objects:
        _validate(obj)
    by_name, parser = _by_name(objects), build_parser()
    for i, rank in ((1, 0), (2, 1)):
        node = by_name[f"StatefulSet/asyncrl-arithmetic-node-{i}"]  # one pod, never two
        args = parser.parse_args(_node(_container(node)["command"]))
        assert args.roles == f"generate=1,train@{rank}", args.roles
        assert _container(node)["resources"] == {"limits": {"nvidia.com/gpu": 2}}


def test_bad_kubernetes_settings_are_refused_on_load() -> None:
    with pytest.raises(ValueError, match=r"placement.kubernetes.namespace: got 'ML_runs'"):
        config_from_dict(_settings(namespace="ML_runs"))
    with pytest.raises(ValueError, match=r"placement.kubernetes.journal_size: got '10 GB'"):
        config_from_dict(_settings(journal_size="10 GB"))
    with pytest.raises(ValueError, match=r"placement.kubernetes.shm_size: got 'lots'"):
        config_from_dict(_settings(shm_size="lots"))
    with pytest.raises(ValueError, match=r"placement.kubernetes.run_as_user: got 0; allowed"):
        config_from_dict(_settings(run_as_user=0))  # root


KUBECTL = """#!/bin/sh
# Stands in for a cluster's kubectl: records its command lines and the Secret it is given.
echo "$*" >> "$STATE/calls"
case "$1" in
get) if [ -e "$STATE/secret.json" ]; then echo secret/x; exit 0; fi
     echo 'Error from server (NotFound): secrets "x" not found' >&2; exit 1 ;;
create) cat > "$STATE/secret.json"; echo created ;;
apply) [ -s "$3" ] || exit 1; echo configured ;;
esac
"""


def test_launch_makes_the_keys_secret_once_through_stdin_and_applies_the_manifests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(KUBECTL)
    (bin_dir / "kubectl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STATE", str(tmp_path))
    cfg = config_from_dict(_settings())
    assert launch_on_kubernetes(cfg, tmp_path, dry_run=False) == 0
    path = manifests_path(cfg, tmp_path)
    assert path == tmp_path / "runs/arithmetic/launch/kubernetes.yaml"
    assert path.read_text() == manifests_text(cfg)
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == ["get secret asyncrl-arithmetic-keys -n ml -o name", "create -f -",
                     f"apply -f {path}"]  # fmt: skip
    secret = json.loads((tmp_path / "secret.json").read_text())
    _validate(secret)
    keys = tmp_path / "keys"
    keys.mkdir()
    _load_keys(secret, keys)
    printed = capsys.readouterr().out
    assert "Secret asyncrl-arithmetic-keys (made now)" in printed
    for data in secret["data"].values():  # no key on a command line or in what is printed
        for text in (data, base64.b64decode(data).decode()):
            assert text not in printed and text not in "\n".join(calls)
    # Launched again (to resume, or with another config): the run keeps its keys.
    assert launch_on_kubernetes(cfg, tmp_path, dry_run=False) == 0
    assert (tmp_path / "calls").read_text().splitlines()[3:] == [calls[0], calls[2]]
    assert json.loads((tmp_path / "secret.json").read_text()) == secret
    assert "(kept, there already)" in capsys.readouterr().out


def test_launch_without_kubectl_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no kubectl there
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(_settings()))
    assert main(["launch", "--on", "kubernetes", "-c", str(config)]) == 2
    assert capsys.readouterr().err == (
        "asyncrl: error: kubectl is not on PATH: run asyncrl launch --on kubernetes where "
        "kubectl reaches the cluster (or --dry-run to see the manifests)\n"
    )
