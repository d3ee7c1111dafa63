"""hydrad.common.cpus: "every core" is every CPU the engine may use.

Real child processes under a real affinity mask and, where this machine lets root make one, a real
cgroup with a CPU quota; the quota files' formats are also read from files written here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from hydrad.common import cpus

ROOT = Path(__file__).resolve().parents[3]

REPORT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from hydrad.common import cpus
sys.stdin.readline()  # the test moves this process into a cgroup first, where it makes one
print(json.dumps({"usable": cpus.usable_cpus(), "affinity": cpus.affinity_cpus(), "quota": cpus.quota_cpus()}), flush=True)
"""


def _report(preexec=None, into: Path | None = None) -> dict[str, object]:  # type: ignore[no-untyped-def]
    child = subprocess.Popen([sys.executable, "-c", REPORT, str(ROOT)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, preexec_fn=preexec)
    try:
        if into is not None:
            (into / "cgroup.procs").write_text(str(child.pid))
        out, _ = child.communicate("go\n", timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0
    return json.loads(out)


def test_an_affinity_mask_narrows_every_core_to_its_cpus() -> None:
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        pytest.skip("this process may run on one CPU only: a narrower mask cannot be shown")
    got = _report(lambda: os.sched_setaffinity(0, {mine[0]}))
    assert got["affinity"] == 1 and got["usable"] == 1, got
    assert _report()["usable"] == cpus.usable_cpus()  # without the mask, what this process may use


def _cpu_cgroup() -> tuple[Path, bool]:
    """A fresh cgroup that can take a CPU quota (v2 with the cpu controller, else v1's cpu hierarchy),
    or a skip naming what is missing."""
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    for _directory, top, v2 in cpus._cpu_cgroup_dirs(Path("/proc/self")):
        if v2 and "cpu" not in (top / "cgroup.subtree_control").read_text().split():
            continue
        d = top / f"hydra-test-{uuid.uuid4().hex[:8]}"
        try:
            d.mkdir()
        except OSError:
            continue
        return d, v2
    pytest.skip("no cgroup hierarchy with a CPU controller that root may add to here")


def _set_quota(d: Path, v2: bool, quota_us: int, period_us: int = 100_000) -> None:
    if v2:
        (d / "cpu.max").write_text(f"{quota_us} {period_us}")
    else:
        (d / "cpu.cfs_period_us").write_text(str(period_us))
        (d / "cpu.cfs_quota_us").write_text(str(quota_us))


@pytest.mark.parametrize("quota_us, cpus_expected", [(100_000, 1), (150_000, 1)])
def test_a_cgroup_cpu_quota_caps_every_core(quota_us: int, cpus_expected: int) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("this process may run on one CPU only: a quota under it cannot be shown")
    d, v2 = _cpu_cgroup()
    try:
        _set_quota(d, v2, quota_us)
        got = _report(into=d)
    finally:
        # the child has ended, so the cgroup is empty and can go
        d.rmdir()
    assert got["quota"] == pytest.approx(quota_us / 100_000), got
    assert got["usable"] == cpus_expected, got
    assert got["affinity"] == len(os.sched_getaffinity(0))  # the quota narrows the count, not the mask


def test_quota_files_of_both_versions_are_read_and_an_unreadable_one_narrows_nothing(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    for text, want in [("max 100000\n", None), ("250000 100000\n", 2.5), ("50000 100000", 0.5),
                       ("max\n", None), ("ten 100000", None), ("", None), ("0 100000", None)]:
        (v2 / "cpu.max").write_text(text)
        assert cpus.read_quota(v2, True) == want, text
    assert cpus.read_quota(tmp_path / "absent", True) is None
    v1 = tmp_path / "v1"
    v1.mkdir()
    for quota, period, want in [("-1", "100000", None), ("200000", "100000", 2.0), ("x", "100000", None),
                                ("100000", "0", None)]:
        (v1 / "cpu.cfs_quota_us").write_text(quota + "\n")
        (v1 / "cpu.cfs_period_us").write_text(period + "\n")
        assert cpus.read_quota(v1, False) == want, (quota, period)


def test_a_containers_own_cgroup_is_found_under_its_mount() -> None:
    # a container's cgroup namespace shows its own cgroup as the mount's root
    assert cpus._under("/sys/fs/cgroup", "/", "/system.slice/hydrad@a.service") == \
        Path("/sys/fs/cgroup/system.slice/hydrad@a.service")
    assert cpus._under("/sys/fs/cgroup", "/docker/abc", "/docker/abc") == Path("/sys/fs/cgroup")
    assert cpus._under("/sys/fs/cgroup", "/docker/abc", "/docker/abc/inner") == Path("/sys/fs/cgroup/inner")
    assert cpus._under("/sys/fs/cgroup", "/docker/abc", "/docker/abcd") is None
    assert cpus._unescape(r"/mnt/with\040space") == "/mnt/with space"


CONTEXT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from hydrad.common.params import RuntimeParams
from hydrad.engine import llama
C = llama.lib()
params = RuntimeParams(n_ctx=256, n_parallel=1)
model = llama.Model.load(sys.argv[2], params)
ctx = llama.Context(model, params)
print(json.dumps({"threads": list(ctx.threads), "llama": [C.llama_n_threads(ctx.ptr), C.llama_n_threads_batch(ctx.ptr)]}))
"""


@pytest.mark.model
def test_a_context_left_at_every_core_computes_with_the_cpus_of_its_mask(smollm_path: Path) -> None:
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        pytest.skip("this process may run on one CPU only: a narrower mask cannot be shown")
    out = subprocess.run([sys.executable, "-c", CONTEXT, str(ROOT), str(smollm_path)], capture_output=True,
                         text=True, timeout=120, preexec_fn=lambda: os.sched_setaffinity(0, {mine[0]}))
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"threads": [1, 1], "llama": [1, 1]}, got


def test_the_usable_count_is_the_mask_capped_by_whole_cpus_of_the_quota() -> None:
    assert cpus.CpuLimits(affinity=4, quota=None).usable == 4
    assert cpus.CpuLimits(affinity=4, quota=2.5).usable == 2  # a pool meets at barriers: no half thread
    assert cpus.CpuLimits(affinity=4, quota=0.5).usable == 1
    assert cpus.CpuLimits(affinity=2, quota=8.0).usable == 2
