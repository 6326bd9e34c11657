"""The prompts an EAGLE-3 head is trained on, built offline from the Python standard library.

Training text must come from the target itself (the head learns to predict the target's next token from
its hidden states) and never from a benchmark's prompts (studies/prompts/*.jsonl are what the head is
measured on). The prompts here are built from what ships with every Python: the source and docstrings of
pure-Python standard-library functions for code tasks, and templated instructions about those modules
and about general topics for chat. The same seed and the same Python release give the same prompts.
"""

from __future__ import annotations

import importlib
import inspect
import random
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Pure-Python modules with many documented functions; none of them prints or starts anything on import.
MODULES = (
    "argparse",
    "ast",
    "base64",
    "bisect",
    "calendar",
    "cmd",
    "collections",
    "colorsys",
    "configparser",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "difflib",
    "dis",
    "email.utils",
    "enum",
    "filecmp",
    "fnmatch",
    "fractions",
    "functools",
    "genericpath",
    "getopt",
    "gettext",
    "glob",
    "gzip",
    "heapq",
    "hmac",
    "html",
    "http.cookies",
    "imghdr",
    "inspect",
    "ipaddress",
    "json.decoder",
    "json.encoder",
    "keyword",
    "linecache",
    "locale",
    "logging",
    "mimetypes",
    "ntpath",
    "numbers",
    "operator",
    "optparse",
    "os",
    "pathlib",
    "pickle",
    "pkgutil",
    "posixpath",
    "pprint",
    "queue",
    "quopri",
    "random",
    "re",
    "reprlib",
    "sched",
    "secrets",
    "selectors",
    "shlex",
    "shutil",
    "smtplib",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "tokenize",
    "traceback",
    "types",
    "typing",
    "urllib.parse",
    "uuid",
    "warnings",
    "wave",
    "weakref",
    "zipfile",
)
MAX_SOURCE_LINES = 28

CODE_TASKS = (
    "Finish the body of this Python function so that it does what its docstring says:\n\n{stub}",
    "Here is the start of a Python function. Write the rest of it.\n\n```python\n{stub}```",
    "Add type hints to this function and return the whole function:\n\n```python\n{source}```",
    "Explain, step by step, what this Python function does:\n\n```python\n{source}```",
    "Write a short docstring for this function and show the function with it:\n\n{bare}",
    "Add a comment above each line of this function:\n\n```python\n{source}```",
    "Rewrite this function so that it is easier to read, without changing what it does:\n\n{source}",
    "Write two pytest tests for this function:\n\n```python\n{source}```",
    "Find a possible bug or edge case in this code and explain it:\n\n{source}",
    "Translate this Python function into plain English, then give an example call:\n\n{source}",
)
DOC_TASKS = (
    "What does `{module}.{name}` do in Python? The documentation says: {doc}",
    "Summarise this documentation in one sentence: {doc}",
    "Give a short Python example that uses `{module}.{name}`.",
    "When would I use `{module}.{name}` instead of writing the code myself?",
    "Explain the Python module `{module}` to a beginner.",
    "List three functions of the Python module `{module}` and say what each does.",
)
TOPICS = (
    "recursion",
    "hash tables",
    "binary search",
    "unit testing",
    "version control",
    "HTTP requests",
    "regular expressions",
    "sorting algorithms",
    "memory management",
    "concurrency",
    "databases",
    "caching",
    "logging",
    "error handling",
    "file formats",
    "command-line tools",
    "code review",
    "the weather",
    "gardening",
    "cooking pasta",
    "learning a language",
    "a train journey",
    "the ocean",
    "time management",
    "healthy breakfasts",
    "the history of computers",
    "planets",
    "music practice",
)
CHAT_TASKS = (
    "Write a short paragraph about {topic}.",
    "Explain {topic} in simple words.",
    "Give me five tips about {topic}.",
    "Write a short poem about {topic}.",
    "What are the pros and cons of {topic}?",
    "Write a haiku about {topic}, then explain it.",
    "Describe {topic} to a ten-year-old.",
    "Write a friendly email to a colleague about {topic}.",
)


@dataclass(frozen=True)
class Snippet:
    module: str
    name: str
    source: str
    doc: str


def stdlib_members(predicate: Callable[[object], bool]) -> list[tuple[str, str, Any, str]]:
    """(module, name, object, dedented source) of the public members of MODULES that ``predicate`` accepts
    and that the module defines itself, in a fixed order; modules this Python lacks are skipped."""
    out = []
    for module_name in MODULES:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name, obj in sorted(vars(module).items()):
            if name.startswith("_") or not predicate(obj) or getattr(obj, "__module__", None) != module.__name__:
                continue
            try:
                source = textwrap.dedent(inspect.getsource(obj))
            except (OSError, TypeError):
                continue
            out.append((module_name, name, obj, source))
    return out


def stdlib_snippets() -> list[Snippet]:
    """Short documented functions of the modules above, in a fixed order."""
    out: list[Snippet] = []
    for module_name, name, obj, source in stdlib_members(inspect.isfunction):
        doc = inspect.getdoc(obj)
        if doc and source.count("\n") <= MAX_SOURCE_LINES:
            out.append(Snippet(module_name, name, source, " ".join(doc.split())[:400]))
    return out


def stub(source: str) -> str:
    """Signature and docstring only (everything up to the docstring's closing quotes)."""
    lines = source.splitlines(keepends=True)
    quotes = 0
    for i, line in enumerate(lines):
        quotes += line.count('"""') + line.count("'''")
        if quotes >= 2:
            return "".join(lines[: i + 1])
    return "".join(lines[:1])


def bare(source: str, doc: str) -> str:
    """The source without its docstring, for the 'write a docstring' task."""
    head = stub(source)
    first = head.splitlines(keepends=True)[0]
    return first + source[len(head) :] if doc else source


def build_prompts(n: int, seed: int = 0, code_share: float = 0.7) -> list[list[dict[str, str]]]:
    """``n`` single-turn chat conversations, code tasks (``code_share``) and chat tasks, from ``seed``."""
    rng = random.Random(seed)
    snippets = stdlib_snippets()
    prompts: list[list[dict[str, str]]] = []
    for _ in range(n):
        roll = rng.random()
        if roll < code_share:
            s = rng.choice(snippets)
            text = rng.choice(CODE_TASKS).format(stub=stub(s.source), source=s.source, bare=bare(s.source, s.doc))
        elif roll < code_share + (1 - code_share) / 2:
            s = rng.choice(snippets)
            text = rng.choice(DOC_TASKS).format(module=s.module, name=s.name, doc=s.doc)
        else:
            text = rng.choice(CHAT_TASKS).format(topic=rng.choice(TOPICS))
        prompts.append([{"role": "user", "content": text}])
    return prompts


PROMPT_MIXES = ("stdlib", "broad")


def prompt_stream(n: int, seed: int, mix: str) -> list[list[dict[str, str]]]:
    """``n`` prompts of a mix: ``stdlib`` (build_prompts, the CPU recipe's) or ``broad`` (the GPU recipe's)."""
    if mix == "stdlib":
        return build_prompts(n, seed=seed)
    if mix == "broad":
        from tuner.models.eagle3_prompts_broad import broad_prompts  # it builds on this module

        return broad_prompts(n, seed=seed)
    raise ValueError(f"prompt mix {mix!r}: one of {', '.join(PROMPT_MIXES)}")


def unique_prompts(n: int, seed: int = 0, mix: str = "stdlib") -> list[list[dict[str, str]]]:
    """The first ``n`` distinct prompts of the mix's stream (prefix-stable: the first 600 of ``stdlib`` are
    the CPU recipe's). The stdlib stream repeats itself more and more (323 snippets x 16 tasks + the chat
    tasks: about 5,400 distinct prompts; 4,000 take some 11,000 draws), so it is drawn until ``n`` distinct
    ones came, and a request beyond what it can give is an error rather than a smaller set."""
    size = 2 * n
    while True:
        seen: set[str] = set()
        out: list[list[dict[str, str]]] = []
        for p in prompt_stream(size, seed, mix):
            if p[0]["content"] not in seen:
                seen.add(p[0]["content"])
                out.append(p)
                if len(out) == n:
                    return out
        if size >= 64 * n:
            raise ValueError(f"the training prompt builder gives only {len(out)} distinct prompts, not {n}")
        size *= 4
