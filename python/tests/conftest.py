"""Shared fixtures: the models, the `vkllm` binary, and the backends.

In CI (CI=true) a missing model, binary or Vulkan device (with
VKLLM_REQUIRE_VULKAN=1) fails the tests instead of skipping them.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

import vkllm

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY = REPO / "tests" / "data" / "reference" / "tiny"
CLI = Path(os.environ.get("VKLLM_BIN", REPO / "target" / "release" / "vkllm"))
IN_CI = os.environ.get("CI") == "true"
REQUIRE_VULKAN = os.environ.get("VKLLM_REQUIRE_VULKAN") == "1"
BACKENDS = ["cpu", "vulkan"]


def missing(what: str) -> None:
    """Skips the test, or fails it in CI."""
    if IN_CI:
        pytest.fail(f"{what} is missing (CI=true: nothing is skipped)")
    pytest.skip(f"{what} is missing")


def open_model(path: Path, backend: str, **kw) -> vkllm.Model:
    """`path` on `backend`; a missing Vulkan device skips unless required."""
    try:
        return vkllm.Model(path, backend=backend, **kw)
    except vkllm.VkllmError as e:
        if backend == "vulkan" and not REQUIRE_VULKAN and not IN_CI:
            pytest.skip(f"no Vulkan device: {e}")
        raise


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def smollm2(backend) -> vkllm.Model:
    if not SMOLLM2.exists():
        missing(f"{SMOLLM2} (scripts/fetch-model.sh fetches it)")
    return open_model(SMOLLM2, backend)


@pytest.fixture(scope="session")
def cli():
    """Runs `vkllm ARGS... --json` and returns the parsed output."""
    if not CLI.exists():
        missing(f"{CLI} (cargo build --release)")

    def run(*args: str):
        out = subprocess.run(
            [str(CLI), *args, "--json"],
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        )
        return json.loads(out.stdout)

    return run


def tiny_archs():
    return sorted(p.name for p in TINY.iterdir() if (p / "reference.json").exists())
