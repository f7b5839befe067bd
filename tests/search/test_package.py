"""flagsearch as a user installs it: the built wheel, installed non-editable into a fresh venv, run from a
folder outside the repository (its data files and shipped spaces found from the wheel, not the tree).

Fast and offline: the wheel is built without build isolation, installed with --no-deps, and the new venv
sees the tool venv's installed dependencies through a .pth line (whose own .pth files, the editable
install's among them, are not processed: the package imported is the wheel's)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.search.test_report import real_study  # noqa: F401  (the fixture)

REPO = Path(__file__).resolve().parents[2]


def _run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv's bin folder, flagsearch installed there from its built wheel."""
    base = tmp_path_factory.mktemp("package")
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                  "-w", str(base / "dist"), str(REPO)], base)
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = (base / "dist").glob("flagsearch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "search/spaces/smollm2-cpu.yaml" in names and "harness/data/quality.yaml" in names
    assert "search/data/paired_boundaries.json" in names and any(n.endswith("licenses/LICENSE") for n in names)
    venv = base / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base)
    assert made.returncode == 0, made.stderr
    py = venv / "bin" / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], base)
                .stdout.strip())
    (site / "zz-tool-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                 "--quiet", str(wheel)], base)
    assert done.returncode == 0, done.stdout + done.stderr
    where = _run([str(py), "-c", "import search, harness; print(search.__file__, harness.__file__)"], base)
    assert str(REPO) not in where.stdout and str(site) in where.stdout, where.stdout + where.stderr
    return venv / "bin"


def test_the_installed_wheel_has_a_version_and_metadata(installed: Path, tmp_path: Path) -> None:
    shown = _run([str(installed / "search"), "--version"], tmp_path)
    assert shown.returncode == 0 and shown.stdout.startswith("search (flagsearch) 0."), shown.stdout + shown.stderr
    meta = _run([str(installed / "python"), "-c", "from importlib.metadata import metadata; m = metadata('flagsearch');"
                 "print(m['License-Expression'], m['Requires-Python'], m.get_all('Provides-Extra'))"], tmp_path)
    assert meta.stdout.split()[:2] == ["Apache-2.0", "<3.13,>=3.11"], meta.stdout + meta.stderr
    assert "'postgresql'" in meta.stdout and "'parquet'" in meta.stdout


def test_a_shipped_space_dry_runs_from_another_folder(installed: Path, tmp_path: Path) -> None:
    # By name, and by the README's repository path (no spaces/ folder here: the shipped copy is used).
    for space in ("smollm2-cpu", "spaces/llamacpp-cpu.yaml"):
        done = _run([str(installed / "search"), "run", space, "--dry-run", "2"], tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "# trial 0 (default)" in done.stdout and "# trial 1" in done.stdout, done.stdout
    missing = _run([str(installed / "search"), "run", "no-such-space", "--dry-run"], tmp_path)
    assert missing.returncode == 2 and "smollm2-cpu" in missing.stderr, missing.stderr
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


@pytest.mark.e2e
def test_the_installed_wheel_reports_a_real_study(installed: Path, real_study: Path,  # noqa: F811
                                                  tmp_path: Path) -> None:
    study = real_study  # test_report.py's real study (built once per worker: the same xdist group)
    out = tmp_path / "report.html"
    done = _run([str(installed / "search"), "report", str(study), "--html", str(out)], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Pareto front" in out.read_text()
    shown = _run([str(installed / "search"), "show", str(study)], tmp_path)
    assert shown.returncode == 0 and "verdict" in shown.stdout, shown.stdout + shown.stderr
