"""The machine as kmp sees it (`kmp.backend.machine`): devices and their
compute capability, versions, the environment record, peak memory."""

import pathlib
import subprocess

import keras
import pytest
from util import torch_only

import kmp
from kmp import backend
from kmp.backend import machine


def test_list_devices_reports_at_least_one_device():
    devices = backend.list_devices()
    assert devices
    assert all(d.platform in ("cpu", "gpu", "tpu") for d in devices)


def test_framework_versions_name_the_backend():
    versions = backend.framework_versions()
    assert versions["backend"] == keras.backend.backend()
    assert versions["keras"] == keras.__version__
    assert versions[backend.name()]


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "value, expected",
    [("8.6", (8, 6)), ((7, 5), (7, 5)), ("9", (9, 0)), (None, None)],
)
def test_parse_capability(value, expected):
    assert machine._parse_capability(value) == expected


@torch_only
def test_torch_cuda_devices_carry_their_compute_capability(monkeypatch):
    import torch

    from kmp import policy

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(
        torch.cuda, "get_device_name", lambda i: ["NVIDIA H100", "T4"][i]
    )
    monkeypatch.setattr(
        torch.cuda, "get_device_capability", lambda i: [(9, 0), (7, 5)][i]
    )
    devices = machine._torch_devices("cuda")
    assert devices == [
        backend.Device("gpu", "NVIDIA H100", (9, 0)),
        backend.Device("gpu", "T4", (7, 5)),
    ]
    # The least capable GPU decides.
    assert policy.choose_policy(devices).policy == "mixed_float16"
    assert machine._torch_devices("cpu")[0].platform == "cpu"


def test_the_environment_record_names_versions_devices_and_tf32():
    record = backend.environment()
    assert record["versions"]["backend"] == backend.name()
    assert record["versions"]["kmp"] == kmp.__version__
    devices = record["hardware"]["devices"]
    assert [d["platform"] for d in devices] == [
        d.platform for d in backend.list_devices()
    ]
    assert record["tf32"] is backend.tf32_enabled()
    # When and from which code: a UTC time, and this checkout's commit.
    assert record["date"].endswith("+00:00") and record["date"][:2] == "20"
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        cwd=pathlib.Path(kmp.__file__).parent,
    )
    if head.returncode:  # a copy without its repository
        assert record["commit"] is None
    else:
        commit = record["commit"]
        assert commit.removesuffix("+changes") == head.stdout.strip()


def test_peak_memory_on_a_cpu_is_the_process_high_water_mark():
    if backend.list_devices()[0].platform != "cpu":
        pytest.skip("an accelerator reports its own allocator's peak")
    status = pathlib.Path("/proc/self/status")
    if not status.exists():
        pytest.skip("no /proc to compare with")
    peak, what = backend.peak_memory()
    high_water = [
        int(line.split()[1]) * 1024  # kB
        for line in status.read_text().splitlines()
        if line.startswith("VmHWM:")
    ][0]
    assert what == "process peak RSS (CPU run: host memory)"
    assert abs(peak - high_water) <= 0.05 * high_water


def test_the_commit_is_kmp_s_own_repository_s_not_a_project_around_it(
    tmp_path,
):
    # kmp installed in a virtualenv inside another project's repository
    # records no commit, not that project's; kmp at its repository's top
    # records the commit, `+changes` with a tracked file changed.
    def git(*args):
        subprocess.run(
            ["git", "-C", str(tmp_path), *args], check=True, capture_output=True
        )

    git("init", "-q")
    for package in ("kmp", "venv/lib/site-packages/kmp"):
        (tmp_path / package).mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert machine._commit_of(str(tmp_path / "kmp")) == head
    installed = tmp_path / "venv/lib/site-packages/kmp"
    assert machine._commit_of(str(installed)) is None
    (tmp_path / "kmp" / "__init__.py").write_text("x = 1\n")
    assert machine._commit_of(str(tmp_path / "kmp")) == head + "+changes"
