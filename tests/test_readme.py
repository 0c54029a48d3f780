"""The README's library examples run as written (the sentence-embedding one needs the model:
skipped locally without it, required under CI, whose install command provides it)."""
import os
import re
from pathlib import Path

import pytest


def _model_installed() -> bool:
    try:
        from rlx_llvm.models import find_model
        import safetensors, tokenizers  # noqa: F401,E401
        find_model()
        return True
    except (ImportError, FileNotFoundError):
        return False


def test_readme_python_examples_run():
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 2, "the README has a library example and a models example"
    for block in blocks:
        if "rlx_llvm.models" in block and not _model_installed():
            if os.environ.get("CI"):
                pytest.fail("CI must install the model for the README's models example")
            continue
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})


def test_readme_commands_match_ci():
    """The README's test command is the one .ci/run runs."""
    root = Path(__file__).resolve().parents[1]
    ci = (root / ".ci" / "run").read_text()
    readme = (root / "README.md").read_text()
    test_cmd = next(line for line in ci.splitlines() if "pytest" in line)
    assert f"```sh\n{test_cmd}\n```" in readme
