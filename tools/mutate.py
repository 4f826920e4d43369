"""Mutation testing of the modules that carry the invariants (issue 15): ``./dev mutate``.

Runs mutmut (3.x) over the modules listed in ``mutation.toml`` with the fast,
deterministic tests only (MockClock, memory substrate, contract tests on Redis; no
process-level integration or chaos tests), then prints a mutation score per module.

Why a staging directory: mutmut names a mutant after its module path relative to the
source root it copies, and only strips a leading ``src.``. The workspace has three
roots (``common/src``, ``hub/src``, ``sidecar/src``), which would give mutants names like
``hub.src.deskbridge_hub._relay...`` that never match the running module
``deskbridge_hub._relay``, so no test would ever be selected. The stage
(``.mutation/``, git-ignored) holds one ``src/`` with the three packages side by side, plus
``tests/`` and ``pyproject.toml`` with a ``[tool.mutmut]`` section written from
``mutation.toml``; mutmut puts ``mutants/src`` first on ``sys.path``, ahead of the
editable installs.

Equivalent mutants (a mutation that cannot change behaviour) are declared in
``mutation.toml`` with a one-line reason each, in two ways: ``[[equivalent_lines]]``
(a regular expression over source lines; mutmut generates no mutant on a matching line,
e.g. a log message's text), ``[[equivalent_change]]`` (a surviving mutant whose one changed
line matches ``removed`` before and ``added`` after, in ``module``), ``[[equivalent_case]]``
(a case-only change of a case-insensitive literal) and ``[equivalent]`` (one mutant by
name). All but line rules are left out of the score and counted in the ``equiv`` column.

A target that sets ``redis = true`` runs tests on real Redis: the one named by
``DESKBRIDGE_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``, as the test suite's
conftest), which mutmut's test runs inherit from this process's environment. It is
PINGed before the run and again after it; a Redis that does not answer stops the run
(exit 1) instead of letting every mutant count as killed by a connection error.

A target may list ``functions`` (globs over mutmut's function names, e.g.
``xǁEntryServerǁfinish``): only their mutants are run and scored (the CI subset uses this).
An ``[[equivalent_change]]`` rule may list ``functions`` too (the same globs): it then
applies only to those functions' mutants (a ``break`` that is a function's last
statement in one function is not in the next one).

Usage:
    ./dev mutate                 every target in mutation.toml (about 30 min on 2 cores)
    ./dev mutate --set ci        only the targets of set "ci" (the CI subset, ~1-2 min)
    ./dev mutate --module _codec only the targets whose module path contains ``_codec``
    ./dev mutate --survivors     also list surviving mutants by name
    ./dev mutate --max-children N  mutmut worker processes (default 1)
    ./dev mutate --fail-under N  exit 1 if any module's score is below N percent

Exit status: 0 when every module of the run reaches its ``min_score`` (and
``--fail-under``), 1 otherwise, 2 for usage errors. A mutant that no selected test reaches
(mutmut's "no tests") counts as surviving.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
#: The stage of a whole set; ``--module NAME`` runs get their own (``.mutation-NAME``), so
#: each keeps its cache and its survivors stay inspectable while another module runs.
STAGE = ROOT / ".mutation"
PACKAGES = {
    "deskbridge_common": ROOT / "common" / "src" / "deskbridge_common",
    "deskbridge_hub": ROOT / "hub" / "src" / "deskbridge_hub",
    "deskbridge_sidecar": ROOT / "sidecar" / "src" / "deskbridge_sidecar",
}
_RESULT = re.compile(r"^\s*(?P<name>[\w.]+__mutmut_\d+): (?P<status>[\w ]+?)\s*$")


#: The Redis the suite's Redis tests use (tests/conftest.py reads the same variable).
REDIS_URL = os.environ.get("DESKBRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _redis_answers(url: str) -> str | None:
    """PING the Redis at ``url`` (AUTH first if it carries a password); None if it
    answered PONG, else what went wrong."""
    parts = urlsplit(url)
    commands = []
    if parts.password:
        auth = (parts.username, parts.password) if parts.username else (parts.password,)
        commands.append(("AUTH", *auth))
    commands.append(("PING",))
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379),
                                      timeout=3) as sock:
            for command in commands:
                packed = f"*{len(command)}\r\n" + "".join(
                    f"${len(arg.encode())}\r\n{arg}\r\n" for arg in command
                )
                sock.sendall(packed.encode())
                reply = sock.recv(1024)
                if not reply.startswith(b"+"):
                    return f"{command[0]} answered {reply!r}"
    except OSError as exc:
        return str(exc)
    return None if reply.startswith(b"+PONG") else f"PING answered {reply!r}"


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join("'" + v.replace("'", "") + "'" for v in values) + "]"


def _module_name(target: dict[str, object]) -> str:
    return str(target["module"]).removesuffix(".py").replace("/", ".")


def _selection(targets: list[dict[str, object]]) -> list[str]:
    """mutmut mutant-name globs for the targets (all of a module, or its ``functions``)."""
    names = []
    for t in targets:
        for function in t.get("functions", ["*"]):  # type: ignore[union-attr]
            names.append(f"{_module_name(t)}.{function}__mutmut_*" if function != "*"
                         else f"{_module_name(t)}.*")
    return names


def _stage(
    targets: list[dict[str, object]],
    tests: list[str],
    pytest_args: list[str],
    line_patterns: list[str],
) -> None:
    """Copy the packages, tests and pytest config into the stage; keep mutmut's cache
    (``mutants/``) so an unchanged function is not tested again."""
    # mutmut keeps its generated mutants across runs; a new line pattern or target list
    # must regenerate them (a module copied unmutated last time is newer than its source,
    # so mutmut would not mutate it now), so the cache is dropped whenever mutation.toml
    # or the modules of the run change.
    only = [f"src/{t['module']}" for t in targets]
    stamp = STAGE / "mutation.toml.sha256"
    digest = hashlib.sha256(
        (ROOT / "mutation.toml").read_bytes() + "\n".join(sorted(only)).encode()
    ).hexdigest()
    if not stamp.exists() or stamp.read_text() != digest:
        shutil.rmtree(STAGE / "mutants", ignore_errors=True)
    STAGE.mkdir(exist_ok=True)
    stamp.write_text(digest)
    src = STAGE / "src"
    if src.exists():
        shutil.rmtree(src)
    for name, path in PACKAGES.items():
        shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    if (STAGE / "tests").exists():
        shutil.rmtree(STAGE / "tests")
    shutil.copytree(ROOT / "tests", STAGE / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    for extra in ("docs", "README.md"):  # files tests read beside the code
        target = STAGE / extra
        if target.is_dir():
            shutil.rmtree(target)
        copy = shutil.copytree if (ROOT / extra).is_dir() else shutil.copy2
        copy(ROOT / extra, target)
    config = (ROOT / "pyproject.toml").read_text()
    config += (
        "\n[tool.mutmut]\n"
        'source_paths = ["src/"]\n'
        f"only_mutate = {_toml_list(only)}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(tests)}\n"
        f"pytest_add_cli_args = {_toml_list(pytest_args)}\n"
        'also_copy = ["docs/", "README.md"]\n'
        f"do_not_mutate_patterns = {_toml_list(line_patterns)}\n"
    )
    (STAGE / "pyproject.toml").write_text(config)


def _results() -> dict[str, str]:
    """``mutmut results --all true`` -> {mutant name: status}."""
    out = subprocess.run(
        [sys.executable, "-m", "mutmut", "results", "--all", "true"],
        cwd=STAGE,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = {}
    for line in out.splitlines():
        m = _RESULT.match(line)
        if m:
            found[m["name"]] = m["status"]
    return found


def _module_of(mutant: str) -> str:
    """``deskbridge_hub._relay.x_relay_loop__mutmut_3`` -> ``deskbridge_hub/_relay.py``;
    methods are named ``xǁClassǁmethod__mutmut_N``."""
    module = mutant.rsplit(".", 1)[0]
    return module.replace(".", "/") + ".py"


def _diff(name: str) -> tuple[list[str], list[str]]:
    """The lines mutant ``name`` removes and adds (``mutmut show``)."""
    diff = subprocess.run(
        [sys.executable, "-m", "mutmut", "show", name],
        cwd=STAGE,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    removed = [line[1:] for line in diff if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in diff if line.startswith("+") and not line.startswith("+++")]
    return removed, added


def _case_only(name: str, diff: tuple[list[str], list[str]], rules: list[dict[str, str]]) -> bool:
    """True if mutant ``name`` only changes the letter case of one line that an
    ``[[equivalent_case]]`` rule declares case-insensitive (e.g. SQL text)."""
    rules = [r for r in rules if fnmatch.fnmatchcase(_module_of(name), r["module"])]
    removed, added = diff
    if not rules or len(removed) != 1 or len(added) != 1 or removed[0] == added[0]:
        return False
    if removed[0].lower() != added[0].lower():
        return False
    return any(re.search(r["pattern"], removed[0]) for r in rules)


def _function_of(mutant: str) -> str:
    """``deskbridge_hub._reader.xǁProcessReaderǁ_pump__mutmut_7`` -> ``xǁProcessReaderǁ_pump``."""
    return mutant.rsplit(".", 1)[-1].rsplit("__mutmut_", 1)[0]


def _change_rule(
    name: str, diff: tuple[list[str], list[str]], rules: list[dict[str, Any]]
) -> str | None:
    """The reason of the first ``[[equivalent_change]]`` rule that mutant ``name``'s diff
    matches: one line changed, the old line matching ``removed``, the new ``added``, in
    the rule's ``module`` and (if it lists them) one of its ``functions``."""
    removed, added = diff
    if len(removed) != 1 or len(added) != 1:
        return None
    function = _function_of(name)
    for rule in rules:
        if (
            fnmatch.fnmatchcase(_module_of(name), rule.get("module", "*"))
            and any(fnmatch.fnmatchcase(function, f) for f in rule.get("functions", ["*"]))
            and re.search(rule["removed"], removed[0])
            and re.search(rule["added"], added[0])
        ):
            return str(rule["reason"])
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev mutate", description=__doc__.split("\n")[0])
    parser.add_argument("--set", default=None, help="only the targets tagged with this set")
    parser.add_argument("--survivors", action="store_true", help="list surviving mutants")
    parser.add_argument("--fail-under", type=float, default=None, metavar="PERCENT")
    parser.add_argument("--module", default=None, metavar="NAME",
                        help="only the targets whose module path contains NAME (e.g. _codec)")
    parser.add_argument("--max-children", type=int, default=1,
                        help="mutmut worker processes (default 1: the machine is shared)")
    args = parser.parse_args(argv)
    if args.module:
        global STAGE
        STAGE = ROOT / f".mutation-{re.sub(r'[^A-Za-z0-9_]', '_', args.module)}"

    spec = tomllib.loads((ROOT / "mutation.toml").read_text())
    wanted = args.set or "full"
    targets = [t for t in spec["target"] if wanted in t.get("sets", [])]
    if args.module:
        targets = [t for t in targets if args.module in str(t["module"])]
    if not targets:
        parser.error(f"no target in mutation.toml matches set {wanted!r}, module {args.module!r}")
    equivalent: dict[str, str] = spec.get("equivalent", {})
    tests = sorted({test for t in targets for test in t["tests"]})
    line_patterns = [e["pattern"] for e in spec.get("equivalent_lines", [])]
    _stage(targets, tests, spec["pytest"]["args"], line_patterns)
    selection = _selection(targets)
    redis = any(t.get("redis") for t in targets)
    if redis:
        if problem := _redis_answers(REDIS_URL):
            print(f"the Redis tests' Redis ({REDIS_URL}, DESKBRIDGE_TEST_REDIS_URL) does not "
                  f"answer: {problem}", file=sys.stderr)
            return 1
        print(f"Redis tests use {REDIS_URL}", file=sys.stderr)

    run = subprocess.run(
        [sys.executable, "-m", "mutmut", "run", "--max-children", str(args.max_children),
         *selection],
        cwd=STAGE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if run.returncode != 0:
        print(run.stderr[-4000:], file=sys.stderr)
        print(f"mutmut run failed with status {run.returncode}", file=sys.stderr)
        return 1
    if redis and (problem := _redis_answers(REDIS_URL)):
        print(f"the Redis tests' Redis ({REDIS_URL}) stopped answering during the run "
              f"({problem}): its kills may be connection errors, not the tests'", file=sys.stderr)
        return 1

    results = {
        name: status
        for name, status in _results().items()
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in selection)
    }
    case_rules = spec.get("equivalent_case", [])
    change_rules = spec.get("equivalent_change", [])
    for name, status in results.items():
        if status != "survived" or name in equivalent:
            continue
        diff = _diff(name)
        if _case_only(name, diff, case_rules):
            equivalent[name] = "case-only change of a case-insensitive literal"
        elif reason := _change_rule(name, diff, change_rules):
            equivalent[name] = reason
    by_module: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name, status in results.items():
        key = "equivalent" if name in equivalent else status
        by_module[_module_of(name)][key].append(name)

    failed = False
    print(f"\n{'module':<42} {'killed':>7} {'survived':>9} {'other':>6} {'equiv':>6} {'score':>7}")
    for target in targets:
        module = target["module"]
        counts = by_module.get(module, {})
        killed = len(counts.get("killed", [])) + len(counts.get("timeout", []))
        # A mutant no test reaches ("no tests") is a survivor too: nothing would notice it.
        survived = len(counts.get("survived", [])) + len(counts.get("no tests", []))
        equiv = len(counts.get("equivalent", []))
        other = sum(
            len(v)
            for k, v in counts.items()
            if k not in ("killed", "timeout", "survived", "no tests", "equivalent")
        )
        total = killed + survived
        score = 100.0 * killed / total if total else 100.0
        floor = max(float(target.get("min_score", 0)), args.fail_under or 0.0)
        mark = "" if score >= floor else f"  < {floor:g}"
        failed |= score < floor
        print(f"{module:<42} {killed:>7} {survived:>9} {other:>6} {equiv:>6} {score:>6.1f}%{mark}")
        if args.survivors:
            for name in sorted(counts.get("survived", [])):
                print(f"    survived: {name}")
            for name in sorted(counts.get("no tests", [])):
                print(f"    no tests: {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
