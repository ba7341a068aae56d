"""Bounds on the shape of a TOML text, checked before tomllib reads it. Pure, no Django.

tomllib's time grows with the square of some shapes: one dotted key of 32 K parts
(`a.a.a...`, 64 KB) took 22 s of CPU, a table header of as many parts 3.5 s. A training
config needs none of them: the reference has 44 lines, 29 keys in 7 tables, two parts to a
name and three levels of brackets. One pass, linear and mostly inside the regex engine,
refuses a text past any bound, naming the line, before tomllib sees it; within the bounds
any text up to the size limit is read in milliseconds.

The pass knows only strings, comments, brackets and separators; malformed TOML is left for
tomllib to name, which it does quickly once the shapes are bounded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_LINES = 1000
MAX_LINE_CHARS = 4096
# Arrays and inline tables inside one another; the reference needs three. tomllib reads
# nesting by recursion: 400 levels of `{b = ` (2.4 KB) were a RecursionError, and 400
# levels of `[` a structure too deep for what reads the config next.
MAX_NESTING = 32
# Parts of one dotted name, a key's or a table header's (`hyperparameters.parallelism`).
MAX_NAME_PARTS = 4
# Keys, table headers and array items together: tomllib pays for each, and more the more
# tables one reopens or extends; so does the check of each after it.
MAX_ENTRIES = 200
# A bare key, number, date or boolean. A long integer is a ValueError out of tomllib, not
# a config error (Python's cap on converting one: 4300 digits, or as few as 640 where set).
MAX_WORD_CHARS = 100
# Neither is an entry, but each is a step here and in tomllib.
MAX_STRINGS_AND_BRACKETS = 1000
# Anywhere in the text: tomllib decodes escapes one at a time, each a step of its own.
MAX_BACKSLASHES = 1000

_WORD = r"""[^\s=,\[\]{}#"'.]"""
# Strings end where tomllib ends them (a closing `"""` may follow up to two quotes of
# content). Loops are possessive: a string cut off by the end of the text must not send
# the regex engine back through every way of splitting it. Bare words are skipped inside
# the engine; only one too long becomes a token.
_TOKEN = re.compile(
    r'"""(?:[^"\\]++|\\[\s\S]|"(?!""))*+(?:"{3,5})?'
    r"|'''(?:[^']++|'(?!''))*+(?:'{3,5})?"
    r'|"(?:[^"\\\n]++|\\[^\n])*+"?'
    r"|'[^'\n]*+'?"
    r"|#[^\n]*+"
    r"|[\n=,\[\]{}.]"
    rf"|(?<!{_WORD}){_WORD}{{{MAX_WORD_CHARS + 1}}}"
)


@dataclass(frozen=True)
class ShapeProblem:
    line: int
    message: str


def toml_shape_problem(text: str) -> ShapeProblem | None:
    """The first place `text` exceeds a bound, or None when tomllib may read it."""
    if text.count("\n") >= MAX_LINES:
        return ShapeProblem(MAX_LINES + 1, f"more than {MAX_LINES} lines")
    for number, line in enumerate(text.split("\n"), start=1):
        if len(line) > MAX_LINE_CHARS:
            return ShapeProblem(number, f"a line longer than {MAX_LINE_CHARS} characters")
    if text.count("\\") > MAX_BACKSLASHES:
        at = -1
        for _ in range(MAX_BACKSLASHES + 1):
            at = text.index("\\", at + 1)
        return ShapeProblem(_line_at(text, at), f"more than {MAX_BACKSLASHES} backslashes")
    depth = entries = dots = strings_and_brackets = 0
    previous = "\n"
    for match in _TOKEN.finditer(text):
        token = match.group()
        first = token[0]
        message = ""
        if first == ".":
            dots += 1
            if dots >= MAX_NAME_PARTS:
                message = f"a dotted name of more than {MAX_NAME_PARTS} parts"
        elif first in "\"'":
            strings_and_brackets += 1
        elif first in "[{":
            if first == "[" and depth == 0 and previous == "\n":
                entries += 1  # a table header; the second `[` of `[[` follows the first
            depth += 1
            strings_and_brackets += 1
            if depth > MAX_NESTING:
                message = f"nesting deeper than {MAX_NESTING} levels"
        elif first in "]}":
            depth = max(depth - 1, 0)
            strings_and_brackets += 1
        elif first in "=,":
            entries += 1
        elif first != "\n" and first != "#":
            message = f"a key or value of more than {MAX_WORD_CHARS} characters outside quotes"
        if first in "\n=,[]{}":
            dots = 0
        if entries > MAX_ENTRIES:
            message = f"more than {MAX_ENTRIES} keys, tables and array items"
        elif strings_and_brackets > MAX_STRINGS_AND_BRACKETS:
            message = f"more than {MAX_STRINGS_AND_BRACKETS} strings and brackets"
        if message:
            return ShapeProblem(_line_at(text, match.start()), message)
        previous = token
    return None


def _line_at(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1
