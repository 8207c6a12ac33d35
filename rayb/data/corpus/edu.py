"""`edu`, the FineWeb-Edu stand-in: lessons stating facts about invented entities among distractor
paragraphs (general knowledge, definitions, arithmetic, procedures), with quizzes that ask them back."""

from __future__ import annotations

import random
from collections.abc import Callable

from rayb.data.corpus.document import (
    MIN_FACTS,
    OVERSHOOT,
    WORDS_PER_QA,
    Doc,
    Exhausted,
    number_words,
    question_count,
    quiz,
    state,
    target_words,
)
from rayb.data.corpus.invented import LEX
from rayb.data.corpus.vocabulary import (
    ACTIVITIES,
    BEFORE,
    BUILT_THINGS,
    CAREFUL_PEOPLE,
    CHECK_THINGS,
    CHECK_VERBS,
    CITY_SIZES,
    COLORS,
    CREATURE_CLASSES,
    CREATURE_SIZES,
    DEFINITIONS,
    DIRECTIONS,
    EDU_QUIZ_HEADERS,
    FOODS,
    FRUITS,
    GENERAL_FACTS,
    GOODS,
    HABITATS,
    JOBS,
    LESSON_OPENERS,
    MATERIALS,
    PEOPLE,
    PETS,
    PROCEDURES,
    PRODUCTS,
    PURPOSES,
    SEASONS,
    STUDY_TOPICS,
    SUBSTANCE_KINDS,
    TOOL_KINDS,
)


def _edu_city(d: Doc, country: str) -> None:
    r = d.rng
    city, river, mayor = d.unique(LEX["places"]), d.unique(LEX["rivers"]), d.person()
    part, size = r.choice(DIRECTIONS), r.choice(CITY_SIZES)
    year, age, good = r.randint(1100, 1890), r.randint(32, 79), r.choice(GOODS)
    people = f"{r.randint(3, 250) * 1000:,}"
    first = r.choice(
        (
            "{c} is a {s} city in the {p} of {k}.",
            "The city of {c} lies in the {p} of {k}.",
            "In the {p} of {k} there is a {s} city called {c}.",
        )
    ).format(c=city, s=size, p=part, k=country)
    d.fact(f"In which part of {country} is {city}?", f"the {part}")
    river_s = r.choice(
        (
            "Its river is called the {r}.",
            "{c} was built on the banks of the {r}.",
            "The river that runs through {c} is the {r}.",
        )
    ).format(r=river, c=city)
    mayor_s = r.choice(
        (
            "The mayor of {c} is {m}, who is {a} years old.",
            "{c} is led by its mayor, {m}, who is {a} years old.",
        )
    ).format(c=city, m=mayor, a=age)
    state(
        d,
        first,
        [
            (river_s, [(f"Which river flows through {city}?", f"the {river}")]),
            (mayor_s, [(f"Who is the mayor of {city}?", mayor), (f"How old is {mayor}?", str(age))]),
            (f"{city} was founded in {year}.", [(f"In which year was {city} founded?", str(year))]),
            (f"About {people} people live there.", [(f"How many people live in {city}?", people)]),
            (f"The city is famous for its {good}.", [(f"What is {city} famous for?", good)]),
        ],
        low=2,
    )


def _edu_person(d: Doc, country: str) -> None:
    r = d.rng
    name, town, job = d.person(), d.unique(LEX["places"]), d.unique(JOBS)
    first_name = name.split()[0]
    he = r.choice(("He", "She"))
    year, years, pet, pet_name = (
        r.randint(1500, 1950),
        r.randint(3, 40),
        r.choice(PETS),
        d.unique(LEX["given"]),
    )
    topic = d.unique(STUDY_TOPICS)
    first = r.choice(
        (
            "{n} was a {j} from {t}.",
            "{n} worked as a {j} in the town of {t}.",
            "One famous {j} from {t} was {n}.",
        )
    ).format(n=name, j=job, t=town)
    d.fact(f"Where was {name} from?", town)
    d.fact(f"What was the job of {name}?", job)
    state(
        d,
        first,
        [
            (f"{he} was born in {year}.", [(f"In which year was {name} born?", str(year))]),
            (
                f"{first_name} spent {years} years studying {topic}.",
                [
                    (f"What did {name} study?", topic),
                    (f"For how many years did {first_name} study {topic}?", str(years)),
                ],
            ),
            (
                f"{he} kept a {pet} named {pet_name}.",
                [(f"What was the name of {first_name}'s {pet}?", pet_name)],
            ),
            (f"Today {first_name} is remembered in {country} as a patient and careful worker.", []),
        ],
        low=1,
    )


def _edu_creature(d: Doc, country: str) -> None:
    r = d.rng
    sp, cls = d.unique(LEX["species"]), r.choice(tuple(CREATURE_CLASSES))
    legs, cover = CREATURE_CLASSES[cls]
    habitat, color, food = d.unique(HABITATS), d.unique(COLORS), r.choice(FOODS)
    life, year = r.randint(2, 60), r.randint(1600, 1990)
    first = r.choice(
        (
            "The {s} is a {z} {c} that lives in {h}.",
            "In {h} of {k} you can find the {s}, a {z} {c}.",
            "The {s} is a {z} {c} found in {h}.",
        )
    ).format(s=sp, z=r.choice(CREATURE_SIZES), c=cls, h=habitat, k=country)
    d.fact(f"Where does the {sp} live?", habitat)
    state(
        d,
        first,
        [
            (f"Its {cover} is {color}.", [(f"What color is the {sp}?", color)]),
            (
                f"It has {number_words(legs)} legs.",
                [(f"How many legs does the {sp} have?", number_words(legs))],
            ),
            (f"The {sp} feeds mostly on {food}.", [(f"What does the {sp} eat?", food)]),
            (f"A healthy {sp} can live for {life} years.", [(f"How long can a {sp} live?", f"{life} years")]),
            (
                f"Scientists first described the {sp} in {year}.",
                [(f"When was the {sp} first described?", str(year))],
            ),
        ],
        low=2,
    )


def _edu_substance(d: Doc, country: str) -> None:
    r = d.rng
    sub, kind, color = d.unique(LEX["substances"]), r.choice(SUBSTANCE_KINDS), d.unique(COLORS)
    town, product = d.unique(LEX["places"]), d.unique(PRODUCTS)
    melt, grams = r.randint(2, 19) * 50, r.randint(20, 900)
    first = r.choice(
        ("{S} is a {c} {k} that is found near {t}.", "Near {t} miners dig up {s}, a {c} {k}.")
    ).format(S=sub.capitalize(), s=sub, c=color, k=kind, t=town)
    d.fact(f"Where is {sub} found?", town)
    d.fact(f"What color is {sub}?", color)
    state(
        d,
        first,
        [
            (f"It melts at {melt} degrees.", [(f"At what temperature does {sub} melt?", f"{melt} degrees")]),
            (
                f"Workers in {country} use {sub} to make {product}.",
                [(f"What is {sub} used to make?", product)],
            ),
            (
                f"A cube of {sub} as wide as a hand weighs about {grams} grams.",
                [(f"How much does a hand-wide cube of {sub} weigh?", f"{grams} grams")],
            ),
        ],
        low=1,
    )


def _edu_term(d: Doc, country: str) -> None:
    r = d.rng
    term, purpose, maker = d.unique(LEX["terms"]), d.unique(PURPOSES), d.person()
    year = r.randint(1200, 1950)
    first = f"A {term} is a {r.choice(TOOL_KINDS)} used to {purpose}."
    d.fact(f"What is a {term} used to do?", purpose)
    state(
        d,
        first,
        [
            (
                f"The first {term} was made by {maker} in {year}.",
                [(f"Who made the first {term}?", maker), (f"When was the first {term} made?", str(year))],
            ),
            (f"Many homes in {country} still keep one.", []),
        ],
        low=0,
    )


_EDU_FACT_BLOCKS: tuple[Callable[[Doc, str], None], ...] = (
    _edu_city,
    _edu_person,
    _edu_creature,
    _edu_substance,
    _edu_term,
)


def _edu_general(d: Doc, country: str) -> None:
    d.add(" ".join(d.rng.sample(GENERAL_FACTS, d.rng.randint(2, 4))))


def _edu_definitions(d: Doc, country: str) -> None:
    d.add(" ".join(d.rng.sample(DEFINITIONS, d.rng.randint(1, 3))))


def _edu_expository(d: Doc, country: str) -> None:
    r = d.rng
    sentences = [
        f"In {r.choice(SEASONS)}, many {r.choice(PEOPLE)} in {country} {r.choice(ACTIVITIES)}.",
        f"A careful {r.choice(CAREFUL_PEOPLE)} always {r.choice(CHECK_VERBS)} the {r.choice(CHECK_THINGS)} "
        f"before {r.choice(BEFORE)}.",
        f"Most {r.choice(BUILT_THINGS)} in this part of {country} are made of {r.choice(MATERIALS)}.",
        f"The road from {r.choice(LEX['places'])} to {r.choice(LEX['places'])} is {r.randint(4, 300)} "
        f"kilometres long.",
        f"When the {r.choice(SEASONS)} rains come, the {r.choice(PEOPLE)} {r.choice(ACTIVITIES)}.",
    ]
    d.add(" ".join(r.sample(sentences, r.randint(2, 4))))


def _edu_arithmetic(d: Doc, country: str) -> None:
    r = d.rng
    sentences = []
    for _ in range(r.randint(2, 4)):
        a, b = r.randint(1, 20), r.randint(1, 20)
        kind = r.randrange(5)
        if kind == 0:
            sentences.append(f"{a} plus {b} equals {a + b}.")
        elif kind == 1:
            sentences.append(
                f"{number_words(a).capitalize()} plus {number_words(b)} is {number_words(a + b)}."
            )
        elif kind == 2:
            hi, lo = max(a, b), min(a, b)
            sentences.append(f"{hi} minus {lo} equals {hi - lo}.")
        elif kind == 3:
            a, b = a % 10 + 1, b % 10 + 1
            sentences.append(f"{a} times {b} equals {a * b}.")
        else:
            fruit = r.choice(FRUITS)
            sentences.append(f"If a basket holds {a} {fruit} and we add {b} more, it holds {a + b} {fruit}.")
    d.add(" ".join(sentences))


def _edu_steps(d: Doc, country: str) -> None:
    r = d.rng
    title, steps = r.choice(PROCEDURES)
    n, m = r.randint(2, 6), r.randint(2, 9)
    lines = [f"{title}:"] + [f"{i}. {step.format(n=n, m=m)}" for i, step in enumerate(steps, 1)]
    d.add("\n".join(lines))


_EDU_FILLERS: tuple[Callable[[Doc, str], None], ...] = (
    _edu_general,
    _edu_definitions,
    _edu_expository,
    _edu_arithmetic,
    _edu_steps,
    _edu_expository,
)


def edu_document(r: random.Random) -> str:
    d = Doc(r)
    target = target_words(r)
    n_questions = question_count(target)
    body_target = max(50, target - WORDS_PER_QA * n_questions - OVERSHOOT)
    max_entities = 2 + target // 100
    country = d.unique(LEX["countries"])
    # One kind of entity dominates so that several entities share attributes: recall must bind the right one.
    main = r.choice(_EDU_FACT_BLOCKS)
    d.add(
        r.choice(("Lesson {n}: {k}", "Chapter {n}. Notes on {k}", "Unit {n}: Life in {k}")).format(
            n=r.randint(1, 30), k=country
        )
    )
    d.add(r.choice(LESSON_OPENERS).format(k=country))
    entities, mid_quiz = 0, False
    while d.words < body_target or len(d.facts) < MIN_FACTS:
        if len(d.facts) < MIN_FACTS or (entities < max_entities and r.random() < 0.45):
            try:
                (main if r.random() < 0.6 else r.choice(_EDU_FACT_BLOCKS))(d, country)
            except Exhausted:
                r.choice(_EDU_FILLERS)(d, country)
            entities += 1
        else:
            r.choice(_EDU_FILLERS)(d, country)
        if not mid_quiz and len(d.facts) >= 6 and 300 < d.words < body_target - 100:
            quiz(d, r.choice(EDU_QUIZ_HEADERS), 2)
            mid_quiz = True
    if d.last_was_fact:  # at least one distractor between the last fact and its question
        r.choice(_EDU_FILLERS)(d, country)
    quiz(d, r.choice(EDU_QUIZ_HEADERS), n_questions)
    return d.text()
