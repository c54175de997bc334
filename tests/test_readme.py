"""The README's Python example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_usage_example_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (example,) = re.findall(r"## Use it\n\n```python\n(.*?)```", readme, re.S)
    script = tmp_path / "example.py"
    script.write_text(example, encoding="utf-8")

    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )

    assert result.returncode == 0, result.stderr
    assert "TaskStatus.COMPLETED" in result.stdout
    assert (tmp_path / "state.db").exists()
