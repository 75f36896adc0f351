"""LiteLLM's proxy as a peer of ``fairshare gateway`` in bench/gateway_peer.py: its install,
its config file and its process.

- ``ensure_installed`` installs ``litellm[proxy]`` at the versions of
  bench/litellm-requirements.txt into a virtualenv of its own (``build/peers/litellm/``,
  git-ignored, never the project's), once: it reuses that virtualenv while the stamp it wrote
  after the last install matches the requirements file and litellm there is the pinned
  version. Wheels only (``--only-binary :all:``): nothing runs a package's build script.
- ``config_yaml`` routes one model to an OpenAI-compatible upstream (the stand-in vLLM
  server), with a master key (the proxy refuses to start without one) and no database; with
  ``callback``, LiteLLM loads the callback it names: fairshare's
  (``fairshare.integrations.litellm``, whose settings ``LiteLLM`` writes beside and names
  in its environment) or the benchmark's do-nothing control (bench/litellm_noop.py).
- ``LiteLLM`` is the proxy as a child process on loopback: one uvicorn worker, started with
  ``--config`` from a temporary directory, with an environment of its own that keeps it
  offline: the model cost map and the other tables it would fetch are read from the package,
  telemetry is vetoed, no ``.env`` file is read, and no variable of this process (tokens,
  database or cache URLs) reaches it. fairshare is imported from this checkout (PYTHONPATH);
  its runtime dependencies are in the requirements file.

The virtualenv is ``build/peers/litellm/`` unless ``FAIRSHARE_LITELLM_VENV`` names another
(one made the same way, from the same requirements file).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from harness.net import LOOPBACK, free_port
from harness.process import ROOT, ServerProcess

REQUIREMENTS = ROOT / "bench" / "litellm-requirements.txt"
"""The exact versions installed; its ``litellm[proxy]==`` line is the peer's version."""
VENV = Path(os.environ.get("FAIRSHARE_LITELLM_VENV") or ROOT / "build" / "peers" / "litellm")
CONFIG_ENV = "FAIRSHARE_LITELLM_CONFIG"
"""The variable that names the callback's settings file (docs/litellm.md)."""
CALLBACK = "fairshare.integrations.litellm.handler"
"""How LiteLLM's config names fairshare's callback (a module's attribute)."""
STAMP = ".requirements.sha256"
"""Written into the virtualenv after a complete install: the requirements file's digest."""
INSTALL_TIMEOUT_S = 1800.0
START_TIMEOUT_S = 180.0
"""Importing the proxy takes tens of seconds on a busy machine."""
HEALTH_PATH = "/health/liveliness"
"""Answers 200 once the proxy serves, without a key."""

OFFLINE_ENV = {
    # Tables the package also ships: read them from it instead of fetching them at start.
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "LITELLM_LOCAL_AUTOROUTER_PRESETS": "True",
    "LITELLM_LOCAL_POLICY_TEMPLATES": "True",
    "LITELLM_TELEMETRY_DISABLED": "true",
    # Not DEV: no .env file is read from the working directory.
    "LITELLM_MODE": "PRODUCTION",
    # Warnings and errors only, as the project's processes log in the benchmark; this also
    # turns uvicorn's access log (a line per request) off.
    "LITELLM_LOG": "WARNING",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    # The stand-in streams one token over and over, which LiteLLM takes for a model stuck
    # in a loop after 100 identical chunks and cuts (a MidStreamFallbackError): a stream
    # of the tests would end after half a second at the stand-in's 200 tokens/s.
    "REPEATED_STREAMING_CHUNK_LIMIT": "1000000",
}
"""The proxy's environment, besides PATH, HOME and the locale."""


def pinned_version(requirements: Path = REQUIREMENTS) -> str:
    """The version of litellm that ``requirements`` pins (its ``litellm[proxy]==`` line)."""
    for line in requirements.read_text(encoding="utf-8").splitlines():
        name, sep, version = line.partition("==")
        if sep and name.strip().lower() == "litellm[proxy]":
            return version.split("#", 1)[0].strip()
    raise ValueError(f"{requirements} pins no litellm[proxy]")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def installed_version(venv: Path) -> str | None:
    """litellm's version in ``venv`` (from its metadata, without importing it); None when
    there is no virtualenv or no litellm in it."""
    python = python_of(venv)
    if not python.exists():
        return None
    probe = "import importlib.metadata as m; print(m.version('litellm'))"
    done = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else None


def is_current(venv: Path, requirements: Path = REQUIREMENTS) -> bool:
    """Whether ``venv`` holds a complete install of ``requirements`` as it is now."""
    stamp = venv / STAMP
    if not stamp.exists() or stamp.read_text(encoding="utf-8").strip() != digest(requirements):
        return False
    return installed_version(venv) == pinned_version(requirements)


def install_command(venv: Path, requirements: Path = REQUIREMENTS) -> list[str]:
    """The pip command line that installs ``requirements`` into ``venv``."""
    return [
        str(python_of(venv)),
        *("-m", "pip", "install", "--disable-pip-version-check", "--no-input"),
        *("--only-binary", ":all:", "-r", str(requirements)),
    ]


def ensure_installed(venv: Path = VENV, requirements: Path = REQUIREMENTS) -> str:
    """Installs the pinned LiteLLM into ``venv`` unless it is there already (a few minutes,
    once); returns its version. The pip output goes to ``venv``/../litellm-install.log.

    Raises:
        RuntimeError: pip failed (the log's tail is in the message).
    """
    version = pinned_version(requirements)
    if is_current(venv, requirements):
        return version
    print(f"installing litellm[proxy]=={version} into {venv} (once; a few minutes)", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    # The base interpreter, not the project's virtualenv: nothing of the project's packages.
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=300)
    log = venv.parent / "litellm-install.log"
    with log.open("wb") as out:
        done = subprocess.run(
            install_command(venv, requirements),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=INSTALL_TIMEOUT_S,
            check=False,
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"installing LiteLLM failed (exit {done.returncode}):\n{tail}")
    found = installed_version(venv)
    if found != version:
        raise RuntimeError(f"{venv} has litellm {found} after the install, not {version}")
    (venv / STAMP).write_text(digest(requirements) + "\n", encoding="utf-8")
    return version


def new_master_key() -> str:
    """A fresh key for one run (LiteLLM asks for the ``sk-`` prefix)."""
    return "sk-" + secrets.token_hex(24)


def config_yaml(
    model: str,
    upstream: str,
    master_key: str,
    *,
    callback: str | None = None,
    aliases: Sequence[str] = (),
) -> str:
    """The proxy's config: ``model`` routed to ``upstream`` (a base URL such as
    ``http://127.0.0.1:PORT``; the OpenAI-compatible API is under its ``/v1``), the master
    key, no database; the one callback ``callback`` names (its module's attribute, such as
    ``CALLBACK``), else none. Each of ``aliases`` is one more model group of the same
    model on the same upstream."""
    doc: dict[str, object] = {
        "model_list": [
            {
                "model_name": name,
                "litellm_params": {
                    "model": f"openai/{model}",
                    "api_base": upstream.rstrip("/") + "/v1",
                    "api_key": "unused",
                },
            }
            for name in (model, *aliases)
        ],
        "general_settings": {"master_key": master_key},
    }
    if callback is not None:
        doc["litellm_settings"] = {"callbacks": [callback]}
    return yaml.safe_dump(doc, sort_keys=False)


def environment(home: Path, fairshare_config: Path | None = None) -> dict[str, str]:
    """The proxy's whole environment: ``OFFLINE_ENV``, PATH, the locale, ``home`` as its
    home and temporary directory (so that it writes nothing outside the run's directory),
    this checkout on its path, and the callback's settings file when there is one."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": str(home),
        "TMPDIR": str(home),
        "PYTHONPATH": str(ROOT),
        **OFFLINE_ENV,
    }
    if fairshare_config is not None:
        env[CONFIG_ENV] = str(fairshare_config)
    return env


class LiteLLM(ServerProcess):
    """LiteLLM's proxy on a free loopback port, serving ``model`` from ``upstream``. Writes
    its config file into ``work`` and runs there; its log is ``work/<name>.log``. With
    ``fairshare`` (the callback's settings, docs/litellm.md), the proxy runs fairshare's
    callback with them; else with ``callback`` the callback it names (bench/litellm_noop.py);
    ``aliases`` are more model groups of ``model`` (``config_yaml``).
    Not started: ``start`` it, then
    ``await wait_http(proxy.health_url, ...)``."""

    def __init__(
        self,
        work: Path,
        model: str,
        upstream: str,
        venv: Path = VENV,
        *,
        fairshare: Mapping[str, object] | None = None,
        name: str = "litellm",
        aliases: Sequence[str] = (),
        callback: str | None = None,
    ) -> None:
        self.master_key = new_master_key()
        config = work / f"{name}.yaml"
        if fairshare is not None:
            if callback is not None:
                raise ValueError("fairshare's settings go with fairshare's callback only")
            callback = CALLBACK
        config.write_text(
            config_yaml(model, upstream, self.master_key, callback=callback, aliases=aliases),
            encoding="utf-8",
        )
        settings: Path | None = None
        if fairshare is not None:
            settings = work / f"{name}-fairshare.yaml"
            settings.write_text(yaml.safe_dump(dict(fairshare), sort_keys=False), encoding="utf-8")
        home = work / f"{name}-home"
        home.mkdir(exist_ok=True)
        port = free_port()
        args = [
            str(venv / "bin" / "litellm"),
            *("--config", str(config), "--host", LOOPBACK, "--port", str(port)),
            *("--num_workers", "1"),
        ]
        super().__init__(
            args,
            address=f"{LOOPBACK}:{port}",
            log=work / f"{name}.log",
            cwd=work,
            env=environment(home, settings),
        )

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def health_url(self) -> str:
        return self.url + HEALTH_PATH
