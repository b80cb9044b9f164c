"""Users install this project, never the package index's ``10xgraph`` (a different project): the README's Install
commands work on a fresh virtual environment of this Python, and no doc line or error message sends anyone to the
index's ``10xgraph``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: ``pip install 10xgraph``, ``"10xgraph[ci]"``: a requirement naming the index's project (a path ending in
#: ``/10xgraph[ci]``, a checkout folder, is ours).
FOREIGN = re.compile(r"""pip install[^\n`]*?(?<![/\w.-])10xgraph\b""")


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").rglob("*.md"))]


def test_no_install_line_names_the_index_s_10xgraph() -> None:
    found = []
    for path in [*_docs(), *sorted((ROOT / "src").rglob("*.py"))]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if FOREIGN.search(line) and "never" not in line.lower():
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == [], "install lines that fetch another project:\n" + "\n".join(found)
    assert FOREIGN.search('pip install "10xgraph[ci]"') and not FOREIGN.search('pip install "/path/to/10xgraph[ci]"')


#: pip as the README's reader runs it, less the bytecode it compiles for every installed module (minutes of a
#: 2-core machine's CPU across the two installs; the imports below compile what they need).
PIP_ENV = {**os.environ, "PIP_NO_COMPILE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def fresh(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the tracked files, as a fresh clone has them, and the python of a new virtual environment."""
    checkout = tmp_path / "checkout"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in tracked.splitlines():
        if (ROOT / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, checkout / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    return checkout, venv / "bin" / "python"


def test_the_servers_pinned_dependencies_install(tmp_path: Path) -> None:
    """#32: constraints/server.txt installs the server on a fresh environment, exactly at its pins."""
    pins = dict(
        line.split("==") for line in (ROOT / "constraints" / "server.txt").read_text().splitlines() if "==" in line
    )
    checkout, python = fresh(tmp_path)
    command = [str(python), "-m", "pip", "install", "-q", ".[server,pg-checkpoint]", "-c", "constraints/server.txt"]
    done = subprocess.run(command, cwd=checkout, capture_output=True, text=True, env=PIP_ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    assert subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True).returncode == 0
    frozen = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout
    installed = dict(line.split("==") for line in frozen.splitlines() if "==" in line)
    assert {name.lower(): v for name, v in pins.items()} == {name.lower(): installed.get(name) for name in pins}, (
        "constraints/server.txt and what it installs differ"
    )
    extra = sorted(set(n.lower() for n in installed) - {n.lower() for n in pins} - {"tenxgraph", "pip", "setuptools"})
    assert extra == [], f"installed but not pinned in constraints/server.txt: {extra}"
    probe = "from tenxgraph.server import create_app; import uvicorn, psycopg_pool, redis"
    assert subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


def test_the_readme_install_commands_install_us(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert "the index's `10xgraph` is a different project" in section
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]
    assert commands and all(c.startswith("pip ") for c in commands), commands
    checkout, python = fresh(tmp_path)
    for command in commands:
        args = [str(python), "-m", "pip", *command.split()[1:]]
        done = subprocess.run([a.strip('"') for a in args], cwd=checkout, capture_output=True, text=True, env=PIP_ENV)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    probe = "import importlib.metadata as m, pytest_replaysafe, tenxgraph; print(m.version('tenxgraph'))"
    version = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert version == __import__("tenxgraph").__version__
    shown = subprocess.run([str(python), "-m", "pytest", "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert "--crash-matrix" in shown.stdout  # the plugin is registered (the ci extra brought pytest)
