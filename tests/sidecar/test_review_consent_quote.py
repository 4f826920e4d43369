"""Review: the approve command shown to the person must paste as one word in the shells
people use. zsh (macOS' default shell) expands a word starting with ``=`` to a command's
path (``=ls`` is ``/bin/ls``; ``=x`` with no command x is an error), and ``_PLAIN_WORD``
let such a job id (the hub allows ``=`` anywhere in a job id) through unquoted."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from deskbridge_sidecar._consent import command_for


@pytest.mark.parametrize("job_id", ["=ls", "=x", "=a=b"])
def test_an_id_starting_with_equals_is_quoted(job_id):
    word = command_for("approve", job_id).split(" ", 2)[2]
    assert not word.startswith("="), word  # zsh's =command expansion
    for shell in filter(None, (shutil.which("bash"), shutil.which("dash"))):
        said = subprocess.run(
            [shell, "-c", f"printf %s {word}"], capture_output=True, text=True, check=True
        ).stdout
        assert said == job_id, (shell, word, said)
