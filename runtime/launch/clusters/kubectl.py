"""``asyncrl launch --on kubernetes``: the run's objects (kubernetes_objects.py) applied by kubectl.

The run's keys (the run secret, the CurveZMQ key pairs) are made here, on this machine,
into a Secret that reaches kubectl on its standard input only: never on a command line,
in a file, or in what is printed. A Secret that is there already is kept: a run's keys
are its own for its whole life (its workers' keys and its scheduler's fences derive from
them), so launching again, to resume or with a changed config, never replaces them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.transport.identity import ensure_run_secret
from asyncrl.transport.security import keygen

from .kubernetes_objects import KEY_FILES, RUN_SECRET, keys_secret, manifests_text

__all__ = ["KubectlError", "launch_on_kubernetes", "manifests_path", "new_run_keys"]


class KubectlError(Exception):
    """kubectl is missing or refused, in one line."""


def launch_on_kubernetes(cfg: RunConfig, cwd: Path, *, dry_run: bool) -> int:
    """Print the manifests (``dry_run``), or make the keys' Secret if there is none and
    apply the manifests, kept in ``RUN_DIR/launch/kubernetes.yaml`` (``cwd``'s run dir).
    ValueError for a run Kubernetes cannot go by; KubectlError if kubectl fails."""
    text = manifests_text(cfg)
    if dry_run:
        print(text, end="")
        return 0
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise KubectlError(
            "kubectl is not on PATH: run asyncrl launch --on kubernetes where "
            "kubectl reaches the cluster (or --dry-run to see the manifests)"
        )
    path = manifests_path(cfg, cwd)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    secret = keys_secret(cfg, new_run_keys())
    namespace, name = secret["metadata"]["namespace"], secret["metadata"]["name"]
    found = subprocess.run(
        [kubectl, "get", "secret", name, "-n", namespace, "-o", "name"],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:  # not there (else creating it says why kubectl cannot)
        _kubectl(kubectl, ["create", "-f", "-"], stdin=json.dumps(secret))
    _kubectl(kubectl, ["apply", "-f", str(path)])
    keys = "kept, there already" if found.returncode == 0 else "made now"
    instance = secret["metadata"]["labels"]["app.kubernetes.io/instance"]
    print(
        f"applied {path}; the run's keys: Secret {name} ({keys}); its pods: kubectl get "
        f"pods -n {namespace} -l app.kubernetes.io/instance={instance}"
    )
    return 0


def manifests_path(cfg: RunConfig, cwd: Path) -> Path:
    """Where the applied manifests are kept, beside Slurm's script."""
    return cwd / RunDir.of(cfg).root / "launch" / "kubernetes.yaml"


def new_run_keys() -> dict[str, bytes]:
    """A new run secret and CurveZMQ key pairs, as the files ``asyncrl node`` reads
    (made by the same code, in a private directory that is gone on return)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ensure_run_secret(root / RUN_SECRET)
        keygen(root / "keys")
        return {
            name: (root / name if name == RUN_SECRET else root / "keys" / name).read_bytes()
            for name in KEY_FILES
        }


def _kubectl(kubectl: str, args: list[str], stdin: str | None = None) -> None:
    done = subprocess.run(
        [kubectl, *args], input=stdin, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()  # its last line is the reason it gave up
        raise KubectlError(
            f"kubectl {' '.join(args)} failed: {said[-1] if said else done.returncode}"
        )
