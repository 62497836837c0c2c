"""Length-constraint and task-type indicators of a prompt (part of the features of Appendix A.4), as data.

An indicator is on when one of its phrases occurs in the prompt's instruction window as whole words (lower case;
words are runs of letters and digits, so "step-by-step" reads as "step by step" and "[WP]" as "wp"). Besides the
phrase lists:

- requested_words: N from "N words" / "N-word" (the first such request), 0 without one; asks_word_limit is its
  indicator;
- asks_count_limit: a number (digits or one..ten, "single") followed by a countable unit ("3 sentences", "five tips").

Words are matched against a set and phrases against the joined words, so a window costs ~50 µs whatever the number of
phrases (fifteen regular expressions over the same text cost ~600 µs).
"""

from __future__ import annotations

import re

import numpy as np

LENGTH_CONSTRAINTS: dict[str, tuple[str, ...]] = {
    "asks_brief": ("brief", "briefly", "concise", "concisely", "short", "succinct", "succinctly",
                   "in a nutshell", "tl dr", "tldr", "one liner"),
    "asks_detail": ("in detail", "detailed", "elaborate", "thorough", "thoroughly", "comprehensive", "comprehensively",
                    "in depth", "at length", "step by step", "long"),
}
TASK_TYPES: dict[str, tuple[str, ...]] = {
    "task_list": ("list", "enumerate", "bullet", "bulleted", "give me", "give three", "give five", "name three",
                  "name five"),
    "task_summarize": ("summarize", "summarise", "summary", "summarization", "summarisation", "key points", "tl dr",
                       "tldr"),
    "task_explain": ("explain", "why", "how does", "how do", "describe", "what causes"),
    "task_question": ("?", "who", "what", "when", "where", "which"),
    "task_story": ("story", "stories", "poem", "tale", "narrative", "fiction", "character", "protagonist", "wp"),
    "task_code": ("code", "function", "python", "program", "script", "sql", "algorithm", "regex"),
    "task_compare": ("compare", "contrast", "difference between", "differences", "versus", "vs"),
    "task_rewrite": ("rewrite", "rephrase", "paraphrase", "edit", "proofread", "translate"),
    "task_classify": ("classify", "categorize", "categorise", "sentiment", "label"),
    "task_from_documents": ("document", "documents", "passage", "passages", "context", "report", "article",
                            "paragraph below", "paragraphs below"),
}
COUNT_WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "single")
COUNT_UNITS = ("sentence", "sentences", "paragraph", "paragraphs", "bullet", "bullets", "point", "points", "line",
               "lines", "item", "items", "tip", "tips", "way", "ways", "example", "examples", "reason", "reasons")
WORD_UNITS = ("word", "words")
NAMES = ("asks_word_limit", "asks_count_limit", *LENGTH_CONSTRAINTS, "requested_words", *TASK_TYPES)

_WORD = re.compile(r"[a-z0-9]+|\?")
_PHRASES = [(frozenset(p for p in phrases if " " not in p), tuple(f" {p} " for p in phrases if " " in p))
            for phrases in (*LENGTH_CONSTRAINTS.values(), *TASK_TYPES.values())]
_UNITS = frozenset((*COUNT_UNITS, *WORD_UNITS))
_COUNTS = frozenset(COUNT_WORDS)
_MAX_REQUESTED_WORDS = 100_000


def indicators(window: str) -> np.ndarray:
    """The NAMES values for an instruction window, in order."""
    words = _WORD.findall(window.lower())
    present = set(words)
    joined = " " + " ".join(words) + " "
    flags = [1.0 if not singles.isdisjoint(present) or any(p in joined for p in phrases) else 0.0
             for singles, phrases in _PHRASES]
    requested, counted = 0, False
    for i in (i for i in range(1, len(words)) if words[i] in _UNITS):
        before = words[i - 1]
        if words[i] in WORD_UNITS:
            if not requested and before.isdigit() and 0 < int(before) < _MAX_REQUESTED_WORDS:
                requested = int(before)
        elif before.isdigit() or before in _COUNTS:
            counted = True
    brief_and_detail = flags[:len(LENGTH_CONSTRAINTS)]
    tasks = flags[len(LENGTH_CONSTRAINTS):]
    return np.array([1.0 if requested else 0.0, 1.0 if counted else 0.0, *brief_and_detail, float(requested), *tasks])


def definition() -> dict[str, object]:
    """The indicators as plain data (stored in an artifact's feature spec)."""
    return {"length_constraints": {k: list(v) for k, v in LENGTH_CONSTRAINTS.items()},
            "task_types": {k: list(v) for k, v in TASK_TYPES.items()}, "count_words": list(COUNT_WORDS),
            "count_units": list(COUNT_UNITS), "word_units": list(WORD_UNITS), "word": _WORD.pattern}
