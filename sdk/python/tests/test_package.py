"""``python -m build`` makes an sdist and a wheel that install and import
in a clean virtual environment (dependencies from the package registry)."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def test_sdist_and_wheel_install_in_a_clean_environment(tmp_path: Path) -> None:
    out = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(HERE)], check=True, capture_output=True)
    wheel = next(out.glob("longrun-*.whl"))
    sdist = next(out.glob("longrun-*.tar.gz"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "longrun/py.typed" in names and "longrun/worker.py" in names
    assert not any(n.startswith("tests/") for n in names)
    for artifact in (wheel, sdist):
        env = tmp_path / f"venv-{artifact.suffix}"
        venv.create(env, with_pip=True)
        python = env / "bin" / "python"
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(artifact)],
            check=True,
            capture_output=True,
        )
        check = "import longrun, longrun.errors; print(longrun.__version__, longrun.Client, longrun.Worker)"
        shown = subprocess.run([str(python), "-c", check], check=True, capture_output=True, text=True, cwd=tmp_path)
        assert shown.stdout.startswith("0.1.0 ")
