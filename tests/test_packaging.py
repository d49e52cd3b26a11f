"""What `pip install agentrl` ships: a wheel built from the sources holds py.typed (PEP 561: type
checkers read agentrl's hints) and the viewer's page template."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_ships_py_typed_and_the_viewer_page(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT / "agentrl", src / "agentrl", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          "--no-index", "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("agentrl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"agentrl/py.typed", "agentrl/viewer.html", "agentrl/tokenizer.py"} <= names
