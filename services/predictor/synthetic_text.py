"""Vocabulary and sentence builders for the SYNTHETIC evaluation corpus (bear.predictor.synthetic_corpus).

The text is pseudo-English assembled from word lists: it has the surface an LLM prompt has (instructions, topics,
documents, questions) and none of the meaning. Each topic has a difficulty in [0, 1] that the corpus turns into lower
scores; its words are what the hashed token features can pick it up from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    difficulty: float  # 0 easy .. 1 hard
    nouns: tuple[str, ...]


def _topic(name: str, difficulty: float, nouns: str) -> Topic:
    return Topic(name, difficulty, tuple(nouns.split()))


TOPICS = (
    _topic("cooking", 0.10,
           "recipe oven flour butter garlic onion sauce dough pasta spice skillet broth dessert kitchen vinegar "
           "pastry"),
    _topic("travel", 0.15,
           "airport passport luggage itinerary hotel train museum beach visa tourist ferry hostel border "
           "souvenir harbour"),
    _topic("gardening", 0.20,
           "soil compost seedling hedge orchard tulip fertilizer greenhouse mulch shrub pruning watering "
           "vegetable blossom"),
    _topic("fitness", 0.25,
           "workout muscle stretching treadmill protein stamina cardio yoga marathon sprint posture dumbbell "
           "recovery hydration"),
    _topic("finance", 0.40,
           "budget savings mortgage interest loan credit pension tax invoice dividend inflation debt insurance "
           "portfolio"),
    _topic("history", 0.45,
           "empire treaty dynasty revolution monarchy colony parliament archive medieval republic chronicle "
           "siege reform monument"),
    _topic("software", 0.60,
           "function compiler database cache thread server query algorithm memory pointer recursion interface "
           "deployment latency"),
    _topic("law", 0.65,
           "statute plaintiff defendant contract liability jurisdiction tribunal appeal clause precedent verdict "
           "regulation tort injunction"),
    _topic("medicine", 0.70,
           "diagnosis symptom dosage therapy antibody pathogen vaccine enzyme cardiac tumor prognosis syndrome "
           "receptor clinic"),
    _topic("physics", 0.85,
           "quantum particle momentum entropy photon relativity velocity wavelength electron spin lattice "
           "thermodynamics inertia plasma"),
    _topic("mathematics", 0.90,
           "theorem integral matrix eigenvalue polynomial derivative prime proof topology lemma vector "
           "probability manifold convergence"),
)
POLICY = _topic("public policy", 0.50,
                "agency oversight appropriation program audit compliance federal grant contractor procurement "
                "department committee legislation stakeholder")

_ADJECTIVES = tuple((
    "new large small public recent main local modern common simple complex different important early "
    "major final annual national"
).split())
_VERBS = tuple((
    "improves affects requires reduces supports describes increases changes includes provides limits "
    "explains replaces protects connects measures"
).split())
_GENERIC_NOUNS = tuple((
    "system process result method report group effect change level problem outcome plan policy value "
    "period structure approach practice"
).split())
_PREPOSITIONS = tuple("in for with during after before across within under".split())
_WORDS_PER_SENTENCE = 11.5
_NAMES = tuple((
    "Alder Brenton Calloway Dunmore Elsworth Fairhaven Glenwood Halvorsen Ingram Jarrow Kestrel Lindqvist "
    "Marlowe Northcott Oakhurst Pemberton Quarry Redmond Stanton Thornbury Underhill Vance Whitlock "
    "Yardley"
).split())


def sentence(rng: np.random.Generator, topic: Topic) -> str:
    return sentences(rng, topic, 1)[0]


def paragraph(rng: np.random.Generator, topic: Topic, num_words: int) -> str:
    """Sentences until about `num_words` words."""
    return " ".join(sentences(rng, topic, max(1, round(num_words / _WORDS_PER_SENTENCE))))


def sentences(rng: np.random.Generator, topic: Topic, count: int) -> list[str]:
    """`count` declarative sentences of 9 or 14 words, about 60% of their nouns from the topic."""
    # Words as Python strings (tolist): formatting NumPy string scalars can swallow a pending Ctrl-C (numpy#20596).
    nouns = [np.where(rng.random(count) < 0.6, rng.choice(np.array(topic.nouns), count),
                      rng.choice(np.array(_GENERIC_NOUNS), count)).tolist() for _ in range(4)]
    adjectives = [rng.choice(np.array(_ADJECTIVES), count).tolist() for _ in range(2)]
    verbs = [rng.choice(np.array(_VERBS), count).tolist() for _ in range(2)]
    prepositions = rng.choice(np.array(_PREPOSITIONS), count).tolist()
    longer = (rng.random(count) < 0.5).tolist()
    out = []
    for i in range(count):
        text = (f"The {adjectives[0][i]} {nouns[0][i]} {verbs[0][i]} the {nouns[1][i]} {prepositions[i]} "
                f"the {nouns[2][i]}")
        if longer[i]:
            text += f" and {verbs[1][i]} the {adjectives[1][i]} {nouns[3][i]}"
        out.append(text + ".")
    return out


def name(rng: np.random.Generator) -> str:
    return f"{rng.choice(_NAMES)} {rng.choice(_GENERIC_NOUNS).capitalize()}"


def noun(rng: np.random.Generator, topic: Topic) -> str:
    return str(rng.choice(topic.nouns))


def adjective(rng: np.random.Generator) -> str:
    return str(rng.choice(_ADJECTIVES))
