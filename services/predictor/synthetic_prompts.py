"""The four prompt regimes of the SYNTHETIC evaluation corpus (paper Appendix A.3), one builder each.

    instruction          short prompt, short answer     (like Alpaca)          ~10–300 prompt tokens
    multidoc_qa          long prompt, short answer      (like HotpotQA)        ~200–5,000
    long_summarization   long prompt, long answer       (like GovReport)       ~1,500–12,000
    creative_writing     short prompt, long answer      (like WritingPrompts)  ~15–80

A builder returns the prompt with two things only it knows: how hard the prompt is, from what is visible in it (topic,
kind of request, constraints, size), and how long a response it calls for. bear.predictor.synthetic_corpus turns these
into each model's score and output length.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bear.predictor.synthetic_text import POLICY, TOPICS, adjective, name, noun, paragraph, sentence

TOKENS_PER_WORD = 1.3  # of a response asked for in words (English prose, Qwen tokenizer)
PROMPT_TOKENS_PER_WORD = 1.1  # of this synthetic text (measured with the Qwen tokenizer)
INSTRUCTION, MULTIDOC_QA, LONG_SUMMARIZATION, CREATIVE_WRITING = (
    "instruction", "multidoc_qa", "long_summarization", "creative_writing")


@dataclass(frozen=True, slots=True)
class SyntheticPrompt:
    task: str
    text: str
    hardness: float  # difficulty visible in the prompt (≈ 0..4); hidden difficulty is added by the corpus
    response_tokens: float  # the response length the prompt calls for, before model effects and noise


# kind: (hardness, response tokens, templates)
_INSTRUCTION_KINDS: dict[str, tuple[float, float, tuple[str, ...]]] = {
    "list": (0.3, 260, ("List {n} {adj} ways to improve the {noun} of a {noun2}.",
                        "Give {n} tips for choosing a {noun}.", "Name {n} examples of a {adj} {noun}.")),
    "explain": (0.6, 320, ("Explain why the {noun} affects the {noun2}.", "Describe how a {adj} {noun} works.")),
    "compare": (0.8, 300, ("Compare the {noun} and the {noun2} in terms of cost and risk.",
                           "What is the difference between a {noun} and a {noun2}?")),
    "code": (1.0, 380, ("Write a Python function that sorts a list of {noun} records by {noun2}.",
                        "Write a SQL query that counts each {noun} per {noun2}.")),
    "rewrite": (0.1, 70, ("Rewrite the following sentence in a more formal tone: {sentence}",
                          "Paraphrase this sentence: {sentence}")),
    "classify": (0.2, 50, ("Classify the sentiment of the following sentence as positive, negative or neutral: "
                           "{sentence}",)),
    "summarize": (0.4, 120, ("Summarize the following paragraph. {paragraph}",)),
    "question": (0.5, 200, ("What is a {noun} and when is it used?",
                            "Who decides how a {noun} is chosen for a {noun2}?")),
}


def instruction(rng: np.random.Generator) -> SyntheticPrompt:
    topic = TOPICS[rng.integers(len(TOPICS))]
    kind = list(_INSTRUCTION_KINDS)[rng.integers(len(_INSTRUCTION_KINDS))]
    hardness, response, templates = _INSTRUCTION_KINDS[kind]
    text = str(rng.choice(templates)).format(
        n=int(rng.integers(3, 8)), adj=adjective(rng), noun=noun(rng, topic), noun2=noun(rng, topic),
        sentence=sentence(rng, topic), paragraph=paragraph(rng, topic, int(rng.integers(40, 150))))
    hardness += 1.5 * topic.difficulty
    if kind in ("list", "explain", "question") and rng.random() < 0.3:
        text += "\n\nInput: " + paragraph(rng, topic, int(rng.integers(30, 120)))
        hardness, response = hardness + 0.2, response * 1.1
    text, hardness, response = _length_request(rng, text, hardness, response, words=(20, 30, 50, 80, 100, 150, 200),
                                               brief="Keep it brief.", detail="Explain in detail.")
    return SyntheticPrompt(INSTRUCTION, text, hardness, response)


def multidoc_qa(rng: np.random.Generator) -> SyntheticPrompt:
    gold = TOPICS[rng.integers(len(TOPICS))]
    num_docs = int(rng.integers(2, 11))
    titles = [name(rng) for _ in range(num_docs)]
    words = np.clip(rng.lognormal(math.log(110), 0.45, num_docs), 40, 400).astype(int)
    docs = [f"Document {i + 1}: {title}\n{paragraph(rng, gold if i < 2 else TOPICS[rng.integers(len(TOPICS))], w)}"
            for i, (title, w) in enumerate(zip(titles, words, strict=True))]
    order = rng.permutation(num_docs)
    a, b = titles[0], titles[1]
    kind = ("bridge", "comparison", "yes_no")[rng.integers(3)]
    question = {
        "bridge": f"Which {noun(rng, gold)} was supported by the {adjective(rng)} {noun(rng, gold)} that {a} "
                  "describes?",
        "comparison": f"Which was established earlier, {a} or {b}?",
        "yes_no": f"Are {a} and {b} both associated with the same {noun(rng, gold)}?",
    }[kind]
    text = ("Answer the question using the documents below.\n\n" + "\n\n".join(docs[i] for i in order)
            + f"\n\nQuestion: {question}")
    hardness = {"bridge": 0.5, "comparison": 0.9, "yes_no": 0.3}[kind] + gold.difficulty
    hardness += 0.5 * math.log(words.sum() / 100)
    response = 120 * {"bridge": 1.0, "comparison": 1.2, "yes_no": 0.7}[kind]
    if rng.random() < 0.4:
        text, response = text + "\nAnswer briefly.", response * 0.5
    elif rng.random() < 0.3:
        text, response = text + "\nExplain your reasoning step by step.", response * 2.5
    return SyntheticPrompt(MULTIDOC_QA, text, hardness, response)


def long_summarization(rng: np.random.Generator) -> SyntheticPrompt:
    secondary = TOPICS[rng.integers(len(TOPICS))]
    target_tokens = float(np.clip(rng.lognormal(math.log(4500), 0.5), 1500, 12_000))
    num_sections = max(2, int(target_tokens / PROMPT_TOKENS_PER_WORD / 600))
    section_words = int(target_tokens / PROMPT_TOKENS_PER_WORD / num_sections)
    sections = [f"Section {k + 1}: {adjective(rng).capitalize()} {noun(rng, POLICY)} review\n"
                + paragraph(rng, POLICY if rng.random() < 0.5 else secondary, section_words)
                for k in range(num_sections)]
    header = str(rng.choice(("Summarize the following government report.", "Write a summary of the report below.")))
    text = header + "\n\n" + "\n\n".join(sections)
    hardness = 0.9 * math.log(target_tokens / 1500) + 0.8 * secondary.difficulty
    response = 520 * (target_tokens / 4500) ** 0.25
    text, hardness, response = _length_request(
        rng, text, hardness, response, words=(150, 200, 300, 400, 500, 600), brief="Write a one-paragraph summary.",
        detail="Provide a detailed summary covering every section.",
        word_template="The summary should be about {n} words.", separator="\n\n")
    return SyntheticPrompt(LONG_SUMMARIZATION, text, hardness, response)


_PREMISES = (
    "You wake up one morning to find that every {noun} in the city has vanished.",
    "A {adj} {noun} discovers it can talk to the {noun2}.",
    "The year is {year}. {name} is the last person who remembers what a {noun} was.",
    "Every night at midnight the {noun} in your kitchen rearranges itself into a message.",
    "{name} inherits a {adj} {noun} with a note that says: do not open until the {noun2} returns.",
)


def creative_writing(rng: np.random.Generator) -> SyntheticPrompt:
    topic = TOPICS[rng.integers(len(TOPICS))]
    text = "[WP] " + str(rng.choice(_PREMISES)).format(
        noun=noun(rng, topic), noun2=noun(rng, topic), adj=adjective(rng), name=name(rng),
        year=int(rng.integers(1850, 2300)))
    hardness = 0.5 * topic.difficulty
    for chance, extra, cost in ((0.25, "Include the words {w}.", 0.4), (0.2, "Tell it from the point of view of the "
                                "{n}.", 0.3), (0.15, "End with a twist.", 0.3)):
        if rng.random() < chance:
            words = ", ".join(str(w) for w in rng.choice(topic.nouns, 3, replace=False))
            text += " " + extra.format(w=words, n=noun(rng, topic))
            hardness += cost
    text, hardness, response = _length_request(rng, text, hardness, 850.0, words=(300, 500, 800, 1000, 1200),
                                               brief="Keep it short.", detail="Make it a long, detailed story.",
                                               word_template="Write a story of about {n} words.")
    hardness += 0.4 * math.log(response / 850)
    return SyntheticPrompt(CREATIVE_WRITING, text, hardness, response)


BUILDERS: dict[str, Callable[[np.random.Generator], SyntheticPrompt]] = {
    INSTRUCTION: instruction,
    MULTIDOC_QA: multidoc_qa,
    LONG_SUMMARIZATION: long_summarization,
    CREATIVE_WRITING: creative_writing,
}


def _length_request(rng: np.random.Generator, text: str, hardness: float, response: float, *, words: tuple[int, ...],
                    brief: str, detail: str, word_template: str = "Answer in {n} words.",
                    separator: str = " ") -> tuple[str, float, float]:
    """Maybe append a length request: a word count (25%), brevity (15%) or detail (15%)."""
    draw = rng.random()
    if draw < 0.25:
        n = int(rng.choice(words))
        return text + separator + word_template.format(n=n), hardness + 0.3, n * TOKENS_PER_WORD
    if draw < 0.40:
        return text + separator + brief, hardness + 0.1, response * 0.45
    if draw < 0.55:
        return text + separator + detail, hardness + 0.3, response * 1.9
    return text, hardness, response
