"""The molecule scenarios of the collection's modules, against the real front-end."""
import os
import re
import shutil
import subprocess

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("scenario", ["modak_image", "modak_job"])
def test_molecule_scenario(scenario, frontend):
    if not shutil.which("molecule"):
        pytest.skip("needs molecule: scripts/setup-venv installs it")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", NO_COLOR="1", ANSIBLE_FORCE_COLOR="0",
               PY_COLORS="0")
    proc = subprocess.run(["molecule", "test", "-s", scenario], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)
    text = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
    assert proc.returncode == 0, text[-5000:]
    for step in ("converge", "idempotence", "verify"):
        assert re.search(rf"{step}: Executed: Successful", text), step
    assert re.search(r"actions=6\s+successful=6", text)
