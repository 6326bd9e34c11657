"""The GPU recipe's training prompts: the standard-library code tasks plus everyday code and chat tasks.

The first GPU head learned its target's answers to standard-library code well (acceptance length 2.9 on
held-out builder prompts) and chat badly: the stdlib builder gives only 224 distinct chat prompts, about 6%
of 4,000, where half of a study's prompts are chat. This mix keeps the stdlib tasks and adds code tasks of
other shapes (translate to another language, rename a variable, fix an injected bug, explain a class, SQL
from a schema) and chat built from templates, general topics and passages of the Python documentation that
ships with every Python (``pydoc_data.topics``). Everything is built offline from a seed; nothing comes from a
benchmark's prompts (tests/test_eagle3_prompts.py checks it against studies/prompts/).
"""

from __future__ import annotations

import ast
import functools
import inspect
import random
import re

from tuner.models.eagle3_prompts import CHAT_TASKS as STDLIB_CHAT_TASKS
from tuner.models.eagle3_prompts import CODE_TASKS, DOC_TASKS, Snippet, bare, stdlib_members, stdlib_snippets, stub

Conversation = list[dict[str, str]]

LANGUAGES = ("JavaScript", "TypeScript", "Go", "Rust", "Java", "C", "C++", "Ruby", "Kotlin", "Swift")
TRANSLATE_TASKS = (
    "Translate this Python function into {lang}:\n\n```python\n{source}```",
    "How would you write this in {lang}? Keep the same behaviour.\n\n{source}",
)
RENAME_TASK = "Rename the variable `{old}` to `{new}` in this function and return the whole function:\n\n{source}"
NEW_NAMES = ("result", "value", "item", "acc", "buffer", "current", "output", "entry", "element", "part")
BUG_TASKS = (
    "This function has a bug. Find it, fix it and return the fixed function:\n\n```python\n{source}```",
    "Something is wrong in this code. What is it, and how would you fix it?\n\n{source}",
)
CLASS_TASKS = (
    "Explain what this Python class is for and how to use it:\n\n```python\n{source}```",
    "Write a short example that uses this class:\n\n{source}",
    "Suggest one improvement to this class and show the changed code:\n\n```python\n{source}```",
)
MAX_CLASS_LINES = 40

SCHEMAS = (
    ("employees(id, name, department_id, salary, hired_on)", "departments(id, title, city)"),
    ("books(id, title, author_id, year, price)", "authors(id, name, country)"),
    ("students(id, name, year)", "grades(student_id, course, score)"),
    ("products(id, name, category, price)", "sales(id, product_id, quantity, sold_at)"),
    ("flights(id, origin, destination, departs_at, seats)", "bookings(id, flight_id, passenger, paid)"),
    ("patients(id, name, born)", "visits(id, patient_id, doctor, visited_on, cost)"),
    ("repositories(id, name, owner, stars)", "commits(id, repository_id, author, committed_at, lines_changed)"),
    ("songs(id, title, artist_id, seconds)", "artists(id, name, genre)"),
)
SQL_TASKS = (
    "Write a SQL query over the tables {a} and {b} that returns {n} rows with the largest totals per group.",
    "Given the tables {a} and {b}, write a SQL query that counts the rows of the second table for each row "
    "of the first.",
    "Write a SQL query that joins {a} with {b} and keeps only the rows from the last 30 days.",
    "Explain what an index on the table {a} would speed up, with one example query.",
    "Write the CREATE TABLE statements for {a} and {b}, with sensible types and keys.",
)

TOPICS = (
    "recursion",
    "hash maps",
    "binary search",
    "unit tests",
    "version control",
    "HTTP",
    "regular expressions",
    "sorting",
    "memory leaks",
    "threads",
    "databases",
    "caching",
    "logging",
    "error handling",
    "JSON",
    "command-line tools",
    "code review",
    "APIs",
    "encryption",
    "passwords",
    "cloud computing",
    "open source",
    "pair programming",
    "technical debt",
    "documentation",
    "containers",
    "linked lists",
    "queues",
    "big-O notation",
    "floating-point numbers",
    "time zones",
    "Unicode",
    "spreadsheets",
    "backups",
    "the weather",
    "gardening",
    "cooking rice",
    "learning a language",
    "a train journey",
    "the ocean",
    "time management",
    "breakfast",
    "the history of computers",
    "the planets",
    "practising music",
    "running",
    "sleep",
    "reading books",
    "saving money",
    "moving house",
    "volcanoes",
    "bees",
    "chess",
    "photography",
    "cycling to work",
    "public libraries",
    "recycling",
    "the moon",
    "rainforests",
    "electric cars",
    "board games",
    "museums",
    "mountains",
    "coffee",
    "tea",
    "friendship",
    "writing letters",
    "the internet",
    "bridges",
    "trees",
    "birds",
    "deserts",
    "rivers",
    "kindness",
    "teamwork",
    "deadlines",
    "meetings",
    "job interviews",
    "public speaking",
    "first aid",
    "camping",
    "baking bread",
    "painting",
    "the printing press",
    "electricity",
    "maps",
    "clocks",
    "calendars",
    "vaccines",
    "dinosaurs",
    "whales",
)
DISHES = (
    "pancakes",
    "vegetable curry",
    "lentil soup",
    "a green salad",
    "fried rice",
    "banana bread",
    "omelette",
    "pasta with garlic and oil",
    "guacamole",
    "roast potatoes",
    "chickpea stew",
    "porridge",
    "flatbread",
)
# The stdlib mix's chat templates and more shapes (stories, comparisons, checklists, recipes).
CHAT_TASKS = (
    *STDLIB_CHAT_TASKS,
    "What is the most common mistake people make with {topic}?",
    "Write a short story in which {topic} matters.",
    "Tell me three surprising facts about {topic}.",
    "How would you teach {topic} to a new team member?",
    "Write a two-line summary of why {topic} matters.",
    "Compare {topic} and {other}.",
    "What do {topic} and {other} have in common?",
    "Write a short dialogue between two friends talking about {topic}.",
    "Give me a checklist for getting started with {topic}.",
    "Write a recipe for {dish}, with the ingredients and the steps.",
    "How long does it take to make {dish}, and what can go wrong?",
)
CHAT_FORMS = (
    "",
    "",
    " Answer in three sentences.",
    " Answer as a numbered list.",
    " Keep it under 100 words.",
    " Use simple words.",
    " Start with a one-line summary.",
    " Use a friendly tone.",
)
PASSAGE_TASKS = (
    "Summarise the following text in one sentence: '{text}'",
    "Rewrite this paragraph in simpler words:\n\n{text}",
    "What is the main point of this text?\n\n{text}",
    "Write three questions a student could answer after reading this:\n\n{text}",
    "Explain this to someone who is new to Python: {text}",
)


@functools.cache
def doc_passages() -> tuple[str, ...]:
    """Prose paragraphs (200-700 characters, no code) of the Python documentation that ships with Python."""
    import pydoc_data.topics

    out = []
    for _, text in sorted(pydoc_data.topics.topics.items()):
        for para in re.split(r"\n\s*\n", text):
            flat = " ".join(para.split())
            prose = not para.startswith("   ") and "::" not in flat and "=" not in flat and flat.count("(") < 4
            if prose and 200 <= len(flat) <= 700:
                out.append(flat)
    return tuple(out)


@functools.cache
def stdlib_classes() -> tuple[str, ...]:
    """Short documented classes of the stdlib modules, in a fixed order."""
    return tuple(
        source
        for _, _, obj, source in stdlib_members(inspect.isclass)
        if inspect.getdoc(obj) and source.count("\n") <= MAX_CLASS_LINES and "def " in source
    )


def with_bug(source: str, rng: random.Random) -> str | None:
    """The function with one comparison or arithmetic operator swapped, or None where it has none."""
    swaps: dict[type, type] = {
        ast.Lt: ast.LtE,
        ast.LtE: ast.Lt,
        ast.Gt: ast.GtE,
        ast.GtE: ast.Gt,
        ast.Eq: ast.NotEq,
        ast.NotEq: ast.Eq,
        ast.Add: ast.Sub,
        ast.Sub: ast.Add,
    }
    tree = ast.parse(source)
    sites: list[tuple[ast.AST, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sites += [(node, i) for i, op in enumerate(node.ops) if type(op) in swaps]
        elif isinstance(node, ast.BinOp) and type(node.op) in swaps:
            sites.append((node, -1))
    if not sites:
        return None
    node, i = rng.choice(sites)
    if isinstance(node, ast.Compare):
        node.ops[i] = swaps[type(node.ops[i])]()
    elif isinstance(node, ast.BinOp):
        node.op = swaps[type(node.op)]()
    return ast.unparse(tree) + "\n"


def local_names(source: str) -> list[str]:
    """Names the function assigns to (not its arguments), in order of first appearance."""
    tree = ast.parse(source)
    args = {a.arg for node in ast.walk(tree) if isinstance(node, ast.arguments) for a in node.args + node.kwonlyargs}
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id not in args:
            if len(node.id) > 1 and node.id not in names:
                names.append(node.id)
    return names


def _code_task(rng: random.Random, snippets: list[Snippet], classes: tuple[str, ...]) -> str | None:
    roll = rng.random()
    s = rng.choice(snippets)
    if roll < 0.45:
        return rng.choice(CODE_TASKS).format(stub=stub(s.source), source=s.source, bare=bare(s.source, s.doc))
    if roll < 0.60:
        return rng.choice(TRANSLATE_TASKS).format(lang=rng.choice(LANGUAGES), source=s.source)
    if roll < 0.70:
        names = local_names(s.source)
        fresh = [n for n in NEW_NAMES if n not in s.source]
        if not names or not fresh:
            return None
        return RENAME_TASK.format(old=rng.choice(names), new=rng.choice(fresh), source=s.source)
    if roll < 0.82:
        buggy = with_bug(s.source, rng)
        return rng.choice(BUG_TASKS).format(source=buggy) if buggy else None
    if roll < 0.92:
        return rng.choice(CLASS_TASKS).format(source=rng.choice(classes))
    a, b = rng.choice(SCHEMAS)
    return rng.choice(SQL_TASKS).format(a=a, b=b, n=rng.choice((3, 5, 10, 20)))


def _chat_task(rng: random.Random, passages: tuple[str, ...]) -> str:
    if rng.random() < 0.25:
        return rng.choice(PASSAGE_TASKS).format(text=rng.choice(passages))
    topic, other = rng.sample(TOPICS, 2)
    task = rng.choice(CHAT_TASKS).format(topic=topic, other=other, dish=rng.choice(DISHES))
    return task + rng.choice(CHAT_FORMS)


def broad_prompts(n: int, seed: int = 0, chat_share: float = 0.4, doc_share: float = 0.1) -> list[Conversation]:
    """``n`` single-turn conversations from ``seed``: chat (``chat_share``), stdlib documentation questions
    (``doc_share``) and code tasks (the rest). A draw that does not fit its snippet (nothing to rename, no
    operator to swap) is drawn again, so the stream depends on the seed alone."""
    rng = random.Random(seed)
    snippets, classes, passages = stdlib_snippets(), stdlib_classes(), doc_passages()
    prompts: list[Conversation] = []
    while len(prompts) < n:
        roll = rng.random()
        if roll < chat_share:
            text: str | None = _chat_task(rng, passages)
        elif roll < chat_share + doc_share:
            s = rng.choice(snippets)
            text = rng.choice(DOC_TASKS).format(module=s.module, name=s.name, doc=s.doc)
        else:
            text = _code_task(rng, snippets, classes)
        if text is not None:
            prompts.append([{"role": "user", "content": text}])
    return prompts
