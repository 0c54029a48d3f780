"""The README's library example runs as written."""
import re
from pathlib import Path


def test_readme_python_example_runs():
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "the README has a python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
