"""The README's "Real children" example runs as written, against a loopback model server."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .openai_server import ChatServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
@pytest.mark.slow  # measured: 16 s under load (--durations)
def test_the_readme_real_children_example_runs(tmp_path: Path) -> None:
    pytest.importorskip("openai", reason="the openai extra is not installed")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Real children\n", 1)[1]
    example = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    assert 'base_url="http://127.0.0.1:11434/v1"' in example
    count = {"id": "call_1", "name": "word_count", "arguments": {"text": "the quick brown fox"}}
    with ChatServer([{"tool_calls": [count]}, {"text": "4 words"}]) as server:
        script = tmp_path / "example.py"
        script.write_text(example.replace("http://127.0.0.1:11434/v1", server.base_url))
        result = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=90
        )
        requests = server.requests

    assert result.returncode == 0, result.stderr
    assert "output='4 words'" in result.stdout
    assert requests[1]["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "4"}
    assert (tmp_path / "state.db").exists()
