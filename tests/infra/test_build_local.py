"""consumer_image/build_local.sh refuses bad input before it touches any engine: the same
checks as `ConsumerImage.from_code` at synth, one line naming the field, exit code 2."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "consumer_image" / "build_local.sh"


def build(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "MESSENGER_PODMAN_DIR": "/nonexistent/podman-state"},
    )


@pytest.mark.parametrize(("args", "says"), [
    (["--app-dir", "/nonexistent/payments"], "code_dir '/nonexistent/payments' is not a folder"),
    (["--arch", "MIPS"], "--arch must be one of X86_64, ARM64, got 'MIPS'"),
    (["--color"], "unknown argument '--color'"),
])
def test_bad_arguments_exit_2_with_one_line_naming_them(args, says):
    result = build(*args)
    assert result.returncode == 2
    assert says in result.stderr
    assert "Traceback" not in result.stderr


def test_a_folder_that_is_no_package_name_is_refused(tmp_path):
    folder = tmp_path / "payments-service"
    folder.mkdir()
    result = build("--app-dir", str(folder))
    assert result.returncode == 2
    assert "must be a Python identifier" in result.stderr
    assert "'payments_service'" in result.stderr  # the fix


def test_print_env_names_the_engine_storage_without_setting_anything_up(tmp_path):
    state = tmp_path / "state"
    result = subprocess.run(
        [str(SCRIPT), "--print-env"], capture_output=True, text=True, timeout=30,
        env={"PATH": "/usr/bin:/bin", "MESSENGER_PODMAN_DIR": str(state)},
    )
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        f"export CONTAINERS_CONF={state}/containers.conf",
        f"export PODMAN=podman\\ --root\\ {state}/storage\\ --runroot\\ {state}/run\\ "
        f"--storage-driver\\ overlay\\ ",
    ]
    assert not state.exists()
