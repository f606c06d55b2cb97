"""``asyncrl launch --on kubernetes``: a run's placement as Kubernetes objects.

One pod per node of the placement (node_plan.py), running that node's ``asyncrl node`` as
under Slurm, from the run's config in a ConfigMap:

- the scheduler's node: a StatefulSet of one pod, its journal on a volume of its own
  (the StatefulSet's claim, which outlives the pod and is the pod's alone), named by a
  headless Service that the other pods' workers dial: Kubernetes' DNS gives the address,
  nothing probes for it. Started again, the pod resumes the run from the journal.
- a node with a group of ranks (train, critic, logp, ref_logp), or with some ranks of a
  group the placement splits over nodes (``train@R-S``): a StatefulSet of one pod, never
  two at once (a rank must not run twice; a Deployment may start a pod before the old
  one is gone), its GPUs as ``nvidia.com/gpu`` limits. A split group's ranks meet where
  its rank 0 announces in the run directory, on the run claim (gangs.py).
- every other node (generators, the CPU roles): a Deployment of one pod, started again
  on another machine when its machine is lost.

Every pod works in /asyncrl, where the run's ReadWriteMany claim is mounted (the run
directory is on it, as on Slurm's shared filesystem), and reads the run's keys from a
Secret that ``asyncrl launch`` makes when it applies (kubectl.py): the Secret is never
in the rendered manifests, so a dry run prints no key.

Every pod runs as ``placement.kubernetes.run_as_user`` (never root, no privilege
escalation, no capabilities), its ``/dev/shm`` bounded by ``shm_size``; a NetworkPolicy
admits to the run's pods only connections from the run's own pods, on any port (the
workers' payload, weight and API ports are picked when they start).
"""

from __future__ import annotations

import base64
import hashlib
import posixpath
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from asyncrl.runtime.contract.config import RunConfig, dump_config
from asyncrl.runtime.contract.config.placement import KubernetesSection
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.launch.plan import GROUPED_ROLES
from asyncrl.transport.host import WILDCARD_HOSTS
from asyncrl.transport.security import CLIENT_PUBLIC, CLIENT_SECRET, SERVER_PUBLIC, SERVER_SECRET

from .node_plan import NodeShare, cluster_nodes

__all__ = [
    "KEYS_DIR",
    "KEY_FILES",
    "WORKDIR",
    "keys_secret",
    "manifests_text",
    "render_manifests",
    "scheduler_address",
]

WORKDIR = "/asyncrl"  # the run claim's mount, every pod's working directory
KEYS_DIR = "/etc/asyncrl/keys"  # scheduler.keys_dir in the pods: the Secret's files
CONFIG_PATH = "/etc/asyncrl/config/run.yaml"
RUN_SECRET = "run.secret"
JOURNAL_VOLUME = "/var/lib/asyncrl"  # the scheduler's journal claim; RUN_DIR/journal links to it
# The Secret's files: the run secret, from which every worker's key derives, and the
# CurveZMQ key pairs. Only the scheduler's pod gets the scheduler's secret key.
KEY_FILES = (RUN_SECRET, SERVER_PUBLIC, SERVER_SECRET, CLIENT_PUBLIC, CLIENT_SECRET)
_WORKER_KEY_FILES = tuple(name for name in KEY_FILES if name != SERVER_SECRET)
# The node's supervisor stops its workers, then its scheduler, 15 s each at most.
_GRACE_S = 60
_MAX_NAME = 30  # the run's name in the objects' names: a StatefulSet's is 52 at most
# ``$$`` is Kubernetes' escape for ``$`` (it expands ``$(NAME)`` in commands).
# Every pod: the Secret's files are readable by the pods' group (fsGroup), which the run
# refuses for its secret, so each pod puts a copy only its user may read where the run
# reads it (the same bytes from every pod; the rename makes it whole or not there).
_PRIVATE_SECRET = (
    'secret=$1 run_dir=$2; shift 2; umask 077; mkdir -p "$run_dir" && '
    'cat "$secret" > "$run_dir/.run.secret.$$HOSTNAME" && '
    'mv -f "$run_dir/.run.secret.$$HOSTNAME" "$run_dir/run.secret" || exit 1; '
)
# The scheduler's pod started again: the run goes on from the journal (a fresh volume
# holds none), and the address the earlier scheduler announced in the run directory is
# stale. The journal's volume is mounted outside the run claim and linked: a mount inside
# it would have the container runtime make the run directory, as root (the empty mount
# point such a mount left there is removed first).
_START_OR_RESUME = (
    'endpoints=$1 journal=$2 kept=$3; shift 3; rmdir "$journal" 2>/dev/null; '
    'mkdir -p "$kept" && ln -sfn "$kept" "$journal" || exit 1; rm -f "$endpoints"; '
    'if [ -n "$$(ls -A "$kept")" ]; then set -- "$@" --resume; fi; exec "$@"'
)


def render_manifests(cfg: RunConfig) -> list[dict[str, Any]]:
    """The run's objects but its keys' Secret: ConfigMap, Service, NetworkPolicy, then one
    workload per node, the scheduler's first. ValueError, one line, for a run Kubernetes
    cannot go by."""
    shares = cluster_nodes(cfg)
    names = _Names.of(cfg)
    _check(cfg, len(shares) > 1)
    config_text = dump_config(replace(cfg, scheduler=replace(cfg.scheduler, keys_dir=KEYS_DIR)))
    digest = hashlib.sha256(config_text.encode()).hexdigest()
    objects = [
        _object("v1", "ConfigMap", names, names.config, {"data": {"run.yaml": config_text}}),
        _service(cfg, names, multi_pod=len(shares) > 1),
        _network_policy(names),
    ]
    dial = scheduler_address(cfg) if len(shares) > 1 else None
    for i, share in enumerate(shares):
        pod = _pod(cfg, names, i, share, dial, digest)
        objects.append(_workload(cfg, names, i, share, pod))
    return objects


def manifests_text(cfg: RunConfig) -> str:
    """``render_manifests`` as the YAML ``kubectl apply -f`` reads, under a header."""
    k8s, names = cfg.placement.kubernetes, _Names.of(cfg)
    objects = render_manifests(cfg)
    head = [
        f"# {cfg.run.name}: {len(objects) - 3} pod(s) in namespace {k8s.namespace}, from its "
        "placement (asyncrl launch --on kubernetes)",
        f"# Needs the ReadWriteMany claim {k8s.run_claim} (the run directory is on it) and the "
        f"Secret {names.keys} (the run's keys), which asyncrl launch makes as it applies.",
    ]
    body = yaml.dump_all(objects, Dumper=_BlockDumper, sort_keys=False, explicit_start=True)
    return "\n".join(head) + "\n" + body


def keys_secret(cfg: RunConfig, files: Mapping[str, bytes]) -> dict[str, Any]:
    """The Secret of the run's keys (``KEY_FILES``, each file's bytes)."""
    missing = [name for name in KEY_FILES if name not in files]
    if missing:
        raise ValueError(f"the run's keys lack {', '.join(missing)}")
    names = _Names.of(cfg)
    data = {name: base64.b64encode(files[name]).decode("ascii") for name in KEY_FILES}
    return _object("v1", "Secret", names, names.keys, {"type": "Opaque", "data": data})


def scheduler_address(cfg: RunConfig) -> str:
    """Where the other pods' workers dial the scheduler: its Service's name, which
    Kubernetes' DNS keeps pointing at the scheduler's pod wherever it runs again."""
    names = _Names.of(cfg)
    namespace = cfg.placement.kubernetes.namespace
    return f"tcp://{names.scheduler}.{namespace}.svc:{cfg.scheduler.control_port}"


class _Names:
    """The run's objects' names: ``asyncrl-RUN-...``, and the labels that select them."""

    def __init__(self, run: str, namespace: str) -> None:
        self.run, self.namespace = run, namespace
        prefix = f"asyncrl-{run}"
        self.config, self.keys = f"{prefix}-config", f"{prefix}-keys"
        self.scheduler = f"{prefix}-scheduler"  # the StatefulSet, its pod's Service
        self.prefix = prefix

    @classmethod
    def of(cls, cfg: RunConfig) -> _Names:
        run = re.sub(r"[^a-z0-9]+", "-", cfg.run.name.lower()).strip("-")
        if not run or len(run) > _MAX_NAME:
            raise ValueError(
                f"run.name: got {cfg.run.name!r}; allowed on Kubernetes: 1 to {_MAX_NAME} "
                "letters, digits and '-' (it names the run's objects)"
            )
        return cls(run, cfg.placement.kubernetes.namespace)

    def component(self, i: int) -> str:
        """Node ``i``'s part of the run: its objects' names, its workers' (``--node``)."""
        return "scheduler" if i == 0 else f"node-{i}"

    def workload(self, i: int) -> str:
        return f"{self.prefix}-{self.component(i)}"

    def labels(self, component: str | None = None) -> dict[str, str]:
        labels = {"app.kubernetes.io/name": "asyncrl", "app.kubernetes.io/instance": self.run}
        return labels if component is None else {**labels, "app.kubernetes.io/component": component}


def _check(cfg: RunConfig, multi_pod: bool) -> None:
    k8s: KubernetesSection = cfg.placement.kubernetes
    if not k8s.image:
        raise ValueError(
            "placement.kubernetes.image: none given; allowed: the container image with "
            "asyncrl and the run's code, e.g. placement.kubernetes.image=registry/asyncrl:1"
        )
    if not k8s.run_claim:
        raise ValueError(
            "placement.kubernetes.run_claim: none given; allowed: a ReadWriteMany "
            f"PersistentVolumeClaim in namespace {k8s.namespace}, made beforehand, to hold "
            "the run directory"
        )
    run_dir = cfg.run.dir
    if posixpath.isabs(run_dir) or ".." in run_dir.split("/"):
        raise ValueError(
            f"run.dir: got {run_dir}; allowed on Kubernetes: a relative path inside the run "
            f"claim (mounted at {WORKDIR}, the pods' working directory)"
        )
    if not multi_pod:
        return  # one pod: its processes talk among themselves, as under asyncrl run
    sched = cfg.scheduler
    if sched.host not in WILDCARD_HOSTS:
        raise ValueError(
            f"scheduler.host: got {sched.host}; allowed on Kubernetes: 0.0.0.0 (a pod's "
            "address is known only once it runs; the other pods dial the scheduler's Service)"
        )
    if not sched.control_port or sched.events_port != sched.control_port + 1:
        raise ValueError(
            f"scheduler.control_port, events_port: got {sched.control_port}, "
            f"{sched.events_port}; allowed on Kubernetes: fixed ports, events on the next one "
            "(the scheduler's Service names them; workers dial the events one past control)"
        )


def _pod_run_dir(cfg: RunConfig) -> str:
    return posixpath.normpath(posixpath.join(WORKDIR, cfg.run.dir))


def _pod(
    cfg: RunConfig, names: _Names, i: int, share: NodeShare, dial: str | None, config_digest: str
) -> dict[str, Any]:
    """The pod template of node ``i``: its ``asyncrl node``, volumes and GPUs."""
    k8s = cfg.placement.kubernetes
    spec: dict[str, Any] = {
        "restartPolicy": "Always",  # a node that exits is started again by Kubernetes
        "terminationGracePeriodSeconds": _GRACE_S,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": k8s.run_as_user,
            "runAsGroup": k8s.run_as_group,
            "fsGroup": k8s.run_as_group,  # the volumes' files: the pods' group's
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(cfg, names.component(i), share, dial)],
        "volumes": _volumes(cfg, names, share.scheduler),
    }
    if k8s.service_account:
        spec["serviceAccountName"] = k8s.service_account
    meta = {
        "labels": names.labels(names.component(i)),
        # A changed config is a changed pod: Kubernetes starts it again with the new one.
        "annotations": {"asyncrl/config-sha256": config_digest},
    }
    return {"metadata": meta, "spec": spec}


def _container(cfg: RunConfig, node: str, share: NodeShare, dial: str | None) -> dict[str, Any]:
    run = RunDir(Path(_pod_run_dir(cfg)))  # the pod's paths, not this machine's
    args = ["node", "-c", CONFIG_PATH, "--roles", share.roles_arg(), "--node", node]
    args += ["--first-index", str(share.first_index)]
    if share.gpus:  # the device plugin shows the pod its K GPUs, numbered 0..K-1
        args += ["--gpus", ",".join(str(gpu) for gpu in range(share.gpus))]
    if dial is not None and not share.scheduler:
        args += ["--scheduler", dial]
    if dial is not None:  # one pod alone keeps its payloads on loopback, as asyncrl run
        # Each worker serves its payloads on its pod's address, which Kubernetes gives.
        args.append("payloads.host=$(POD_IP)")
    container: dict[str, Any] = {"name": "node", "image": cfg.placement.kubernetes.image}
    container["workingDir"] = WORKDIR
    secret = [posixpath.join(KEYS_DIR, RUN_SECRET), str(run.root)]
    if share.scheduler:
        script = ["/bin/sh", "-c", _PRIVATE_SECRET + _START_OR_RESUME, "start-or-resume"]
        kept = posixpath.join(JOURNAL_VOLUME, "journal")
        container["command"] = [*script, *secret, str(run.endpoints), str(run.journal), kept,
                                "asyncrl", *args]  # fmt: skip
    else:
        script = ["/bin/sh", "-c", _PRIVATE_SECRET + 'exec "$@"', "start"]
        container["command"] = [*script, *secret, "asyncrl", *args]
    container["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    if share.scheduler and dial is not None:
        sched = cfg.scheduler
        container["ports"] = [
            {"name": "control", "containerPort": sched.control_port},
            {"name": "events", "containerPort": sched.events_port},
        ]
    if dial is not None:
        pod_ip = {"fieldRef": {"fieldPath": "status.podIP"}}
        container["env"] = [{"name": "POD_IP", "valueFrom": pod_ip}]
    if share.gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": share.gpus}}
    container["volumeMounts"] = _mounts(share.scheduler)
    return container


def _mounts(scheduler: bool) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": "run", "mountPath": WORKDIR},
        {"name": "config", "mountPath": posixpath.dirname(CONFIG_PATH), "readOnly": True},
        {"name": "keys", "mountPath": KEYS_DIR, "readOnly": True},
        # Staged weights and trainer state, payloads: a container's own /dev/shm is 64 MiB.
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    if scheduler:  # the journal in a directory of it: its root may hold lost+found
        mounts.append({"name": "journal", "mountPath": JOURNAL_VOLUME})
    return mounts


def _volumes(cfg: RunConfig, names: _Names, scheduler: bool) -> list[dict[str, Any]]:
    k8s = cfg.placement.kubernetes
    files = KEY_FILES if scheduler else _WORKER_KEY_FILES
    keys = {
        "secretName": names.keys,
        "defaultMode": 0o400,  # the owner's alone, as on disk
        "items": [{"key": name, "path": name} for name in files],
    }
    return [
        {"name": "run", "persistentVolumeClaim": {"claimName": k8s.run_claim}},
        {"name": "config", "configMap": {"name": names.config}},
        {"name": "keys", "secret": keys},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": k8s.shm_size}},
    ]


def _workload(
    cfg: RunConfig, names: _Names, i: int, share: NodeShare, pod: dict[str, Any]
) -> dict[str, Any]:
    selector = {"matchLabels": pod["metadata"]["labels"]}
    spec: dict[str, Any] = {"replicas": 1, "selector": selector}
    if not (share.scheduler or GROUPED_ROLES & share.roles.keys()):
        spec.update(strategy={"type": "Recreate"}, template=pod)  # one pod of a node at a time
        return _object("apps/v1", "Deployment", names, names.workload(i), {"spec": spec})
    spec.update(serviceName=names.scheduler, template=pod)
    if share.scheduler:
        k8s = cfg.placement.kubernetes
        claim: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": k8s.journal_size}},
        }
        if k8s.journal_storage_class:
            claim["storageClassName"] = k8s.journal_storage_class
        spec["volumeClaimTemplates"] = [{"metadata": {"name": "journal"}, "spec": claim}]
    return _object("apps/v1", "StatefulSet", names, names.workload(i), {"spec": spec})


def _service(cfg: RunConfig, names: _Names, *, multi_pod: bool) -> dict[str, Any]:
    """Headless: its name resolves to the scheduler's pod, wherever that runs."""
    spec: dict[str, Any] = {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,  # dialled from the start: the pods have no probes
        "selector": names.labels("scheduler"),
    }
    if multi_pod:
        sched = cfg.scheduler
        spec["ports"] = [
            {"name": "control", "port": sched.control_port},
            {"name": "events", "port": sched.events_port},
        ]
    return _object("v1", "Service", names, names.scheduler, {"spec": spec})


def _network_policy(names: _Names) -> dict[str, Any]:
    """The run's pods take connections from the run's pods only (on any port: workers
    pick theirs as they start); what they dial out to is left open."""
    run_pods = {"matchLabels": names.labels()}
    spec = {"podSelector": run_pods, "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": run_pods}]}]}  # fmt: skip
    return _object("networking.k8s.io/v1", "NetworkPolicy", names, names.prefix, {"spec": spec})


def _object(api: str, kind: str, names: _Names, name: str, body: dict[str, Any]) -> dict[str, Any]:
    meta = {"name": name, "namespace": names.namespace, "labels": names.labels()}
    return {"apiVersion": api, "kind": kind, "metadata": meta, **body}


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the config) as YAML blocks; no anchors: each object reads whole."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_BlockDumper.add_representer(str, _str)
