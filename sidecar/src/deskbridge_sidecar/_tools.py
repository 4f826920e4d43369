"""Tools: the ``@tool`` decorator, :class:`ToolRegistry`, :class:`ToolError`, invocation,
and the built-in ``echo`` and ``sleep``.

How tools are found: ``@tool`` *marks* a function (it attaches a :class:`Tool` description
and returns the function unchanged, so it stays callable and testable); nothing is
registered globally. A :class:`ToolRegistry` collects marked functions explicitly, with
:meth:`ToolRegistry.add` or :meth:`ToolRegistry.add_module` (what ``--tools MODULE`` does).
Importing a module therefore never changes what another daemon or test exposes.

How tools run: a tool receives the job's ``args`` as keyword arguments and returns
JSON-able data. ``async def`` tools run in the caller's task and are cancellable. Plain
``def`` tools run in a worker thread (``trio.to_thread.run_sync``) so a CPU-bound or
blocking tool never blocks the task that reads the socket. A thread cannot be
interrupted: a running sync tool ignores the hub's ``cancel`` (it finishes and its real
outcome is reported); only stopping the daemon abandons the thread
(``abandon_on_cancel=True``), which then runs to completion unobserved.

``status`` is not a registry tool: the session answers it itself from live state (see
``_session``), so its name is reserved.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import json
import logging
import re
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Annotated, Any, TypeVar, overload

import attrs
import pydantic
import trio
from deskbridge_common import ToolSpec, replace_lone_surrogates, replace_lone_surrogates_in

from ._consent import approval_after_wait_s
from ._errors import ArgsInvalid, ToolError
from ._outcome import BAD_ARGS, BAD_RESULT, CRASHED, Outcome, truncate
from ._progress import Progress
from ._typed import Arguments, to_json_value

log = logging.getLogger("deskbridge.sidecar.tools")

F = TypeVar("F", bound=Callable[..., Any])

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")
_MARK = "__deskbridge_tool__"

#: The name the session answers itself (live state, never cached, never queued).
STATUS_TOOL = "status"
#: Catalogue entry announced for ``status``.
STATUS_SPEC = ToolSpec(
    name=STATUS_TOOL,
    description=(
        "Liveness probe answered by a dedicated worker, never behind a running tool: "
        "wall time, monotonic time, sidecar version, the tool running now, the catalogue."
    ),
    args_schema={"type": "object"},
    side_effects=False,
)


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - async callable objects
    )


def _function_name(fn: Callable[..., Any]) -> str:
    """``module:qualified.name`` of ``fn`` (of its class for a callable object): the same
    across processes for the same code, unlike ``id``."""
    target = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(target, '__module__', '')}:{getattr(target, '__qualname__', '')}"


@attrs.frozen(eq=False)
class Tool:
    """A callable the hub may invoke by ``name``.

    Attributes:
        name: catalogue name, ``[A-Za-z0-9_.-]{1,64}``.
        fn: the function; receives ``args`` as keyword arguments.
        description: for humans and agents (default: the docstring's first paragraph).
        args_schema: JSON Schema of ``args`` as announced (default: derived from the
            type hints, see :mod:`deskbridge_sidecar._typed`).
        side_effects: True if running twice is not harmless (announced to the hub).
        is_async: True for ``async def`` (runs in a task, cancellable), False for sync
            (runs in a worker thread, not interruptible).
        config: what else decides what a call does, not in the catalogue (a toolset's
            roots or origins); part of :meth:`fingerprint` only.
    """

    name: str
    fn: Callable[..., Any]
    description: str
    args_schema: dict[str, Any]
    side_effects: bool
    is_async: bool
    signature: inspect.Signature
    arguments: Arguments
    config: str = ""

    def fingerprint(self, *, earlier: bool = False) -> str:
        """SHA-256 (hex) of this tool's catalogue entry, :attr:`config` and the function
        it calls (module and qualified name: another ``--tools`` module's ``submit`` with
        the same entry is another tool): what a queued call was validated against. A
        restart with another fingerprint is a changed tool (docs/tools.md).

        ``earlier``: without the function, as sidecars before it recorded fingerprints
        (a ledger they wrote is compared with this at the first start after an upgrade).
        """
        spec = self.spec()
        entry = [spec.name, spec.description, spec.args_schema, spec.side_effects,
                 spec.approval_after_wait_s, self.config]  # fmt: skip
        if not earlier:
            entry.append(_function_name(self.fn))
        text = json.dumps(entry, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        side_effects: bool = False,
        args_schema: dict[str, Any] | None = None,
    ) -> Tool:
        """Describe ``fn`` as a tool (see :func:`tool` for the arguments).

        Raises:
            ValueError: bad name, reserved name (``status``), or a required
                positional-only parameter (tools are called with keyword arguments only).
            TypeError: ``fn`` is not callable, ``args_schema`` is not a dict, or a type
                hint cannot be resolved or turned into a schema by pydantic.
        """
        if not callable(fn):
            raise TypeError(f"tool must be callable, got {fn!r}")
        tool_name = name if name is not None else getattr(fn, "__name__", "")
        if not isinstance(tool_name, str) or not _NAME_RE.match(tool_name):
            raise ValueError(f"tool name {tool_name!r} must match [A-Za-z0-9_.-]{{1,64}}")
        if tool_name == STATUS_TOOL:
            raise ValueError("the tool name 'status' is reserved for the built-in status probe")
        sig = inspect.signature(fn)
        for param in sig.parameters.values():
            if param.kind is param.POSITIONAL_ONLY and param.default is param.empty:
                raise ValueError(
                    f"tool {tool_name!r}: parameter {param.name!r} is positional-only; "
                    "tools receive their args as keyword arguments"
                )
        if args_schema is not None and not isinstance(args_schema, dict):
            raise TypeError("args_schema must be a dict (a JSON Schema object)")
        if description is None:
            doc = inspect.getdoc(fn) or ""
            description = doc.split("\n\n", 1)[0].strip()
        arguments = Arguments.from_function(fn, sig, injected=(Progress,))
        return cls(
            name=tool_name,
            fn=fn,
            description=description,
            args_schema=args_schema if args_schema is not None else arguments.schema,
            side_effects=bool(side_effects),
            is_async=_is_async(fn),
            signature=sig,
            arguments=arguments,
        )

    def spec(self) -> ToolSpec:
        """This tool's catalogue entry for the ``hello`` frame (with its
        ``@needs_approval`` declaration, read from :attr:`fn` now: the mark may be put on
        above or below ``@tool``). Text that is not valid Unicode (a lone surrogate: a
        name that is not UTF-8, as ``os.fsdecode`` gives it) gets U+FFFD in its place:
        callers must be able to read the catalogue (MCP ``tools/list`` failed)."""
        return ToolSpec(
            name=self.name,
            description=replace_lone_surrogates(self.description[:4096]),
            args_schema=replace_lone_surrogates_in(self.args_schema),
            side_effects=self.side_effects,
            approval_after_wait_s=approval_after_wait_s(self.fn),
        )

    def convert_args(self, args: dict[str, Any]) -> dict[str, Any]:
        """Validate ``args`` against the type hints and convert them (strict, as JSON).

        Returns:
            The keyword arguments to call :attr:`fn` with.

        Raises:
            ArgsInvalid: the message names each offending field by its path.
        """
        return self.arguments.validate(self.name, args)

    def check_args(self, args: dict[str, Any]) -> str | None:
        """Return why ``args`` are refused (see :meth:`convert_args`), or None if valid."""
        try:
            self.convert_args(args)
        except ArgsInvalid as exc:
            return str(exc)
        return None


@overload
def tool(fn: F, /) -> F: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    side_effects: bool = False,
    args_schema: dict[str, Any] | None = None,
) -> Callable[[F], F]: ...


def tool(
    fn: Any = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    side_effects: bool = False,
    args_schema: dict[str, Any] | None = None,
) -> Any:
    """Mark a function as a deskbridge tool. Use bare (``@tool``) or with options.

    The function is returned unchanged, with its :class:`Tool` description attached;
    collect it with :meth:`ToolRegistry.add` or :meth:`ToolRegistry.add_module`.

    Args:
        fn: the function (when used bare).
        name: catalogue name (default: the function's ``__name__``).
        description: default: the docstring's first paragraph.
        side_effects: True if running the tool twice is not harmless (a click, a
            submit). Announced to the hub; every tool is deduplicated either way.
        args_schema: JSON Schema for ``args`` as announced; default: derived from the
            type hints with pydantic (a property per keyword parameter, ``required`` for
            those without defaults, descriptions from ``Annotated[..., Field(...)]`` or the
            docstring's ``Args:``, ``additionalProperties: false`` unless the function
            takes ``**kwargs``; self-contained, no ``$ref``). Either way the sidecar
            validates ``args`` against the type hints before the tool runs.

    Returns:
        The function itself (bare use) or a decorator.

    Raises:
        ValueError, TypeError: see :meth:`Tool.from_function`.
    """

    def mark(f: F) -> F:
        setattr(
            f,
            _MARK,
            Tool.from_function(
                f,
                name=name,
                description=description,
                side_effects=side_effects,
                args_schema=args_schema,
            ),
        )
        return f

    return mark(fn) if fn is not None else mark


def tool_of(obj: Any) -> Tool | None:
    """The :class:`Tool` attached to ``obj`` by ``@tool``, or None."""
    found = getattr(obj, _MARK, None)
    return found if isinstance(found, Tool) else None


def _origin(t: Tool) -> str:
    """Where ``t``'s function is defined, for a name clash: ``module.qualname``, said to
    be the sidecar's own for the built-ins and toolsets (a clash only named the name)."""
    where = f"{getattr(t.fn, '__module__', '?')}.{getattr(t.fn, '__qualname__', '?')}"
    return f"the sidecar's own ({where})" if where.startswith("deskbridge_sidecar.") else where


class ToolRegistry:
    """The tools one sidecar offers, by name.

    Args:
        tools: functions (marked with ``@tool`` or plain, which get default options) or
            :class:`Tool` objects to add.
        builtins: include ``echo`` and ``sleep`` (default True). ``status`` is always
            offered by the session and never lives in a registry.

    Raises:
        ValueError: two tools share a name.
    """

    def __init__(self, tools: Iterable[Callable[..., Any] | Tool] = (), *, builtins: bool = True):
        self._tools: dict[str, Tool] = {}
        if builtins:
            self.add(echo)
            self.add(sleep)
        for item in tools:
            self.add(item)

    def add(self, item: Callable[..., Any] | Tool) -> Tool:
        """Add one tool and return its :class:`Tool`.

        Adding the very same tool twice is a no-op.

        Raises:
            ValueError: another tool already has this name (or see :meth:`Tool.from_function`).
        """
        if isinstance(item, Tool):
            found = item
        else:
            found = tool_of(item) or Tool.from_function(item)
        existing = self._tools.get(found.name)
        if existing is not None:
            if existing is found or existing.fn is found.fn:
                return existing
            raise ValueError(
                f"two tools are named {found.name!r}: {_origin(existing)} and "
                f"{_origin(found)} (give one another name: @tool(name=...))"
            )
        self._tools[found.name] = found
        return found

    def add_module(self, module: str | types.ModuleType) -> list[Tool]:
        """Import ``module`` (a dotted name or a module) and add every ``@tool`` in it.

        Only functions marked with ``@tool`` found in the module's namespace are added
        (imported ones included), in definition order.

        Returns:
            The tools added (or already present).

        Raises:
            ImportError: the module cannot be imported (any exception raised while
                importing it propagates as is).
            ValueError: the module has no ``@tool`` functions, or a name clashes.
        """
        mod = importlib.import_module(module) if isinstance(module, str) else module
        found = [t for t in (tool_of(v) for v in vars(mod).values()) if t is not None]
        if not found:
            raise ValueError(f"module {mod.__name__!r} has no @tool functions")
        return [self.add(t) for t in found]

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or None."""
        return self._tools.get(name)

    def names(self) -> list[str]:
        """Tool names, in the order they were added."""
        return list(self._tools)

    def specs(self) -> tuple[ToolSpec, ...]:
        """Catalogue entries, in the order the tools were added."""
        return tuple(t.spec() for t in self._tools.values())

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"ToolRegistry({self.names()!r})"


async def invoke(tool: Tool, args: dict[str, Any], *, progress: Progress | None = None) -> Outcome:
    """Run ``tool`` once with ``args`` and capture what happened.

    Args:
        tool: the tool.
        args: keyword arguments (the job's ``args`` object).
        progress: passed to a parameter annotated :class:`Progress`, if the tool has
            one (default: a callback that records nothing).

    Returns:
        ``Outcome.success(value)`` (a model, dataclass, Enum or datetime result is
        serialised as pydantic's JSON mode does), or a failure: ``bad_args`` (args do
        not match the type hints; the tool never ran), the ``ToolError``'s code,
        ``crashed`` (any other exception; message = repr, truncated; traceback logged),
        ``bad_result`` (value not JSON-serialisable / too big).

    Raises:
        trio.Cancelled: cancellation propagates. An async tool is cancelled at its next
            checkpoint; a sync tool's thread is abandoned and keeps running.
    """
    try:
        kwargs = tool.convert_args(args)
    except ArgsInvalid as exc:
        return Outcome.failure(BAD_ARGS, str(exc))
    for name in tool.arguments.injected:
        kwargs[name] = progress if progress is not None else Progress.discard()
    try:
        if tool.is_async:
            value = await tool.fn(**kwargs)
        else:
            value = await trio.to_thread.run_sync(
                functools.partial(tool.fn, **kwargs), abandon_on_cancel=True
            )
    except ToolError as exc:
        return Outcome.failure(exc.code, exc.message)
    except Exception as exc:
        log.exception("tool %s crashed", tool.name)
        return Outcome.failure(CRASHED, truncate(repr(exc)))
    try:
        value = to_json_value(value)
    except TypeError as exc:
        return Outcome.failure(BAD_RESULT, truncate(f"result is not JSON-serialisable: {exc}"))
    return Outcome.success(value)


# -- built-ins ---------------------------------------------------------------------------


@tool(description="Return the args object unchanged.")
async def echo(**args: Any) -> dict[str, Any]:
    """Return ``args`` unchanged."""
    return args


#: The longest ``sleep`` (seconds): the longest ``timeout_s`` a call may ask for (the
#: hub's ``LONGEST_TIMEOUT_S``, one day). A running tool is not stopped at its call's
#: deadline (that is a start deadline), so a longer sleep would hold the desktop's
#: serial worker past every caller's wait.
LONGEST_SLEEP_S = 24 * 3600.0


@tool
async def sleep(
    seconds: Annotated[
        float,
        pydantic.Field(
            ge=0, le=LONGEST_SLEEP_S, allow_inf_nan=False, description="how long, in seconds"
        ),
    ],
) -> dict[str, Any]:
    """Sleep for `seconds` without blocking anything else; returns {"slept_s": seconds}.
    Cancellable.

    Args:
        seconds: how long, in seconds (finite, 0 to ``LONGEST_SLEEP_S`` = 86,400; checked
            before the tool runs: a larger value is ``bad_args``).
    """
    await trio.sleep(seconds)
    return {"slept_s": seconds}


__all__ = [
    "STATUS_SPEC",
    "STATUS_TOOL",
    "ArgsInvalid",
    "Tool",
    "ToolError",
    "ToolRegistry",
    "echo",
    "invoke",
    "sleep",
    "tool",
    "tool_of",
]
