"""rayb.pinned: the package set the suite passed on, and how a run names a machine that differs from it."""

from __future__ import annotations

import pytest

from rayb import pinned


def test_this_machine_runs_the_tested_set():
    # The README's commands and CI install through rayb/constraints.txt.
    assert pinned.mismatches() == {}


@pytest.mark.skipif(
    set(pinned.GPU_ONLY) & set(pinned.installed()), reason="the GPU-only packages are pinned apart"
)
def test_the_committed_set_is_what_this_machine_freezes():
    assert pinned.freeze() == pinned.CONSTRAINTS.read_text()


def test_a_package_at_another_version_or_missing_is_named_and_a_missing_extra_is_not(monkeypatch):
    installed = pinned.installed()
    numpy, pyarrow = installed["numpy"][0], installed["pyarrow"][0]
    # pyarrow, which rayb itself needs, and mamba-ssm, of the optional cuda extra, uninstalled.
    left = {name: entry for name, entry in installed.items() if name not in ("pyarrow", "mamba-ssm")}
    monkeypatch.setattr(pinned, "installed", lambda: left)
    pins = {
        "numpy": "0.0.1",
        "pyarrow": pyarrow,
        "mamba-ssm": "2.3.2.post1",
        "packaging": installed["packaging"][0],
    }
    diff = pinned.mismatches(pins)
    assert diff == {"numpy": ("0.0.1", numpy), "pyarrow": (pyarrow, None)}
    line = pinned.summary(diff)
    assert f"numpy {numpy} (tested 0.0.1), pyarrow missing (tested {pyarrow})" in line
    assert f"pip install -c {pinned.CONSTRAINTS} -e ." in line
