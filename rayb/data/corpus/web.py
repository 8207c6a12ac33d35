"""`web`, the DCLM stand-in: forum threads, support chats and classified listings. Users state facts
in the first person; later posts and quizzes ask them back in the third person."""

from __future__ import annotations

import random
from collections.abc import Callable

from rayb.data.corpus.document import (
    MIN_FACTS,
    OVERSHOOT,
    WORDS_PER_QA,
    Doc,
    Exhausted,
    question_count,
    quiz,
    target_words,
)
from rayb.data.corpus.invented import LEX
from rayb.data.corpus.vocabulary import (
    CHAT_SMALL_TALK,
    CHATTER,
    COLORS,
    EVENTS,
    GROCERIES,
    HANDLE_ANIMALS,
    HANDLE_WORDS,
    ITEM_ADJS,
    ITEMS,
    MONTHS,
    NUMBER_KINDS,
    PARTS,
    PETS,
    RELATIVES,
    SEASONS,
    SPOTS,
    THREAD_TITLES,
    TIPS,
    WEB_QUIZ_HEADERS,
    WEEKDAYS,
)


def _price(r: random.Random, low: int = 5, high: int = 400) -> str:
    return (
        f"${r.randint(low, high)}" if r.random() < 0.7 else f"${r.randint(low, high)}.{r.randrange(100):02d}"
    )


def _date(r: random.Random) -> str:
    return f"{r.choice(MONTHS)} {r.randint(1, 28)}"


def _time(r: random.Random) -> str:
    hour = r.randint(7, 21)
    return f"{(hour - 1) % 12 + 1}:{r.choice(('00', '15', '30', '45'))} {'am' if hour < 12 else 'pm'}"


def _handle(d: Doc) -> str:
    r = d.rng
    while True:
        if r.random() < 0.5:
            h = f"{r.choice(HANDLE_WORDS)}_{r.choice(HANDLE_ANIMALS)}"
        else:
            h = f"{r.choice(LEX['given']).lower()}{r.randint(1, 99)}"
        if h not in d._used:
            d._used.add(h)
            return h


def _shop(d: Doc) -> str:
    r = d.rng
    return r.choice(("{f} Hardware", "the {p} market", "{g}'s shop", "the big store in {p}")).format(
        f=d.unique(LEX["family"]), p=d.unique(LEX["places"]), g=d.unique(LEX["given"])
    )


def _web_purchase(d: Doc, u: str) -> str:
    r = d.rng
    item, shop, price, adj = d.unique(ITEMS), _shop(d), _price(r), r.choice(ITEM_ADJS)
    d.fact(f"How much did {u} pay for the {item}?", price)
    d.fact(f"Where did {u} buy the {item}?", shop)
    d.refs.append((u, f"@{u} {price} for a {item} is a good deal."))
    return r.choice(
        (
            "I bought a {a} {i} from {s} for {p} last {w}.",
            "Picked up a {a} {i} at {s} for {p}.",
            "Got my {a} {i} from {s}, it was {p}.",
        )
    ).format(a=adj, i=item, s=shop, p=price, w=r.choice(WEEKDAYS))


def _web_pet(d: Doc, u: str) -> str:
    r = d.rng
    pet, name, age = d.unique(PETS), d.unique(LEX["given"]), r.randint(1, 15)
    d.fact(f"What is the name of {u}'s {pet}?", name)
    d.fact(f"How old is {u}'s {pet}?", f"{age} years old")
    d.refs.append((u, f"@{u} {name} is a great name for a {pet}!"))
    return r.choice(
        ("My {p} {n} is {a} years old now.", "Our {p} is called {n} and will be {a} years old soon.")
    ).format(p=pet, n=name, a=age)


def _web_home(d: Doc, u: str) -> str:
    r = d.rng
    town, minutes = d.unique(LEX["places"]), r.randint(5, 90)
    d.fact(f"Where does {u} live?", town)
    d.refs.append((u, f"@{u} I used to live in {town} too, small world."))
    return f"I live in {town}, about {minutes} minutes from the {r.choice(LEX['rivers'])}."


def _web_event(d: Doc, u: str) -> str:
    r = d.rng
    event, town, date = d.unique(EVENTS), d.unique(LEX["places"]), _date(r)
    d.fact(f"When is the {event} in {town}?", date)
    d.refs.append((u, f"See you all at the {event} on {date}!"))
    return r.choice(("The {e} in {t} is on {d} this year.", "Heads up: the {e} in {t} moved to {d}.")).format(
        e=event, t=town, d=date
    )


def _web_number(d: Doc, u: str) -> str:
    r = d.rng
    kind, number = d.unique(NUMBER_KINDS), str(r.randint(10_000, 999_999))
    d.fact(f"What is {u}'s {kind} number?", number)
    return f"My {kind} number is {number}, if that helps."


def _web_meeting(d: Doc, u: str) -> str:
    r = d.rng
    spot, time = d.unique(SPOTS), _time(r)
    d.fact(f"Where did {u} suggest meeting?", spot)
    d.fact(f"At what time did {u} suggest meeting at {spot}?", time)
    d.refs.append((u, f"{spot.capitalize()} at {time} works for me."))
    return f"We could all meet at {spot} at {time} on {r.choice(WEEKDAYS)}."


def _web_list(d: Doc, u: str) -> str:
    r = d.rng
    things = [d.unique(GROCERIES) for _ in range(r.randint(3, 5))]  # before any fact: may raise Exhausted
    lines = [r.choice(("My shopping list for the weekend:", "Here is what I still need to buy:"))]
    for thing in things:
        price = _price(r, 1, 12)
        lines.append(f"- {thing}: {price}")
        d.fact(f"On {u}'s list, what is the price of the {thing}?", price)
    return "\n".join(lines)


_WEB_FACTS: tuple[Callable[[Doc, str], str], ...] = (
    _web_purchase,
    _web_pet,
    _web_home,
    _web_event,
    _web_number,
    _web_meeting,
    _web_list,
)


def _chatter(d: Doc) -> str:
    r = d.rng
    if r.random() < 0.15:
        return "A few things that helped me:\n" + "\n".join(f"- {t}" for t in r.sample(TIPS, r.randint(2, 4)))
    return " ".join(
        template.format(
            item=r.choice(ITEMS),
            n=r.randint(2, 30),
            month=r.choice(MONTHS),
            town=r.choice(LEX["places"]),
            part=r.choice(PARTS),
            weekday=r.choice(WEEKDAYS),
            relative=r.choice(RELATIVES),
        )
        for template in r.sample(CHATTER, r.randint(1, 3))
    )


def _forum(d: Doc, body_target: int) -> None:
    r = d.rng
    max_facts = 1 + body_target // 80
    users = [_handle(d) for _ in range(r.randint(2, 5))]
    d.add(
        "Thread: "
        + r.choice(THREAD_TITLES).format(
            item=r.choice(ITEMS),
            town=r.choice(LEX["places"]),
            event=r.choice(EVENTS),
            season=r.choice(SEASONS),
        )
    )
    month, day, n_facts = r.randrange(12), r.randint(1, 20), 0
    header = r.choice(("Posted by {u} on {d}:", "{u} wrote on {d}:", "[{d}] {u}:"))
    told: set[tuple[str, Callable]] = set()  # each user states each kind of fact once: "Where does X live?"
    while d.words < body_target or len(d.facts) < MIN_FACTS or d.last_was_fact:
        user, roll, body, is_fact = r.choice(users), r.random(), "", False
        if len(d.facts) < MIN_FACTS or (n_facts < max_facts and roll < 0.45 and d.words < body_target):
            kind = r.choice(_WEB_FACTS)
            if (user, kind) not in told:
                try:
                    body, is_fact = kind(d, user), True
                    told.add((user, kind))
                except Exhausted:
                    pass
            n_facts += 1
        elif d.refs and roll < 0.6 and d.refs[0][0] != user:
            body = d.refs.pop(0)[1]  # oldest first: a reply comes soon after the post it answers
        if not body:
            body = _chatter(d)
        day += r.randint(0, 2)
        stamp = f"{MONTHS[(month + day // 28) % 12]} {day % 28 + 1}"
        d.add(header.format(u=user, d=stamp) + "\n" + body, is_fact=is_fact)


def _chat_small_talk(r: random.Random) -> str:
    return "\n".join(r.choice(CHAT_SMALL_TALK)).format(
        part=r.choice(PARTS), weekday=r.choice(WEEKDAYS), n=r.randint(7, 30)
    )


def _chat(d: Doc, body_target: int) -> None:
    """A support chat: each round is one order whose details are asked back later."""
    r = d.rng
    d.add(r.choice(("Support chat transcript", "Customer service conversation", "Live chat log")))
    greeting = "Hi, I have a question about my order."
    while d.words < body_target or len(d.facts) < MIN_FACTS:
        try:
            item, town = d.unique(ITEMS), d.unique(LEX["places"])
        except Exhausted:
            break
        number, date, colors, cost = (
            str(r.randint(10_000, 99_999)),
            _date(r),
            r.sample(COLORS, 2),
            _price(r, 3, 40),
        )
        chosen = r.choice(colors)
        d.fact(f"What is the order number for the {item}?", number)
        d.fact(f"Which color did the user choose for the {item}?", chosen)
        d.fact(f"Where should the {item} be sent?", town)
        d.fact(f"How much does delivery of the {item} cost?", cost)
        lines = [
            f"User: {greeting}",
            "Reply: "
            + r.choice(
                (
                    "Of course. What is the order number?",
                    "Sure, can you give me the order number?",
                    "Happy to help. Which order is it?",
                )
            ),
            r.choice(
                ("User: It is {n}. I ordered a {i} on {d}.", "User: Order {n}, a {i} I ordered on {d}.")
            ).format(n=number, i=item, d=date),
            r.choice(
                (
                    "Reply: Thank you. The {i} comes in {a} and {b}. Which one would you like?",
                    "Reply: I see it. We have the {i} in {a} or {b}. Which color do you want?",
                )
            ).format(i=item, a=colors[0], b=colors[1]),
            r.choice((f"User: {chosen.capitalize()}, please.", f"User: The {chosen} one.")),
            r.choice(
                ("Reply: Done. Where should we send it?", "Reply: Noted. Where should it be delivered?")
            ),
            f"User: To {town}, {r.randint(1, 200)} {r.choice(LEX['family'])} Road.",
            f"Reply: Delivery to {town} takes {r.randint(2, 9)} days and costs {cost}.",
        ]
        if r.random() < 0.3:  # the user repeats details: a short-range copy, easier than the quiz
            lines += [
                f"User: Just to check, that is order {number} for the {chosen} {item}?",
                "Reply: Yes, exactly.",
            ]
        d.add("\n".join(lines), is_fact=True)
        greeting = r.choice(
            (
                "One more thing, about another order.",
                "I also have a second order.",
                "Can you check another order for me?",
            )
        )
        if r.random() < 0.6:  # small talk between orders varies the recall distance
            d.add(_chat_small_talk(r))
    if d.last_was_fact:
        d.add(_chat_small_talk(r))


def _listings(d: Doc, body_target: int) -> None:
    """A classifieds page: several items for sale, each with its own price, seller and place."""
    r = d.rng
    d.add(f"{r.choice(LEX['places'])} classifieds, {_date(r)}")
    while d.words < body_target or len(d.facts) < MIN_FACTS:
        try:
            item, town = d.unique(ITEMS), d.unique(LEX["places"])
        except Exhausted:
            break
        seller, buyer, price = _handle(d), _handle(d), _price(r)
        d.fact(f"What is the price of the {item}?", price)
        d.fact(f"Who is selling the {item}?", seller)
        d.fact(f"Where can the {item} be picked up?", town)
        lines = [
            f"For sale: {r.choice(ITEM_ADJS)} {item}. Price: {price}. Seller: {seller}. Pick up in {town}.",
            r.choice(
                (
                    "Barely used, works well.",
                    "Some scratches but works fine.",
                    "Moving house, must go.",
                    f"Comes with the original {r.choice(PARTS)}.",
                )
            ),
            "Comments:",
            f"- {buyer}: "
            + r.choice(("Is it still available?", "Would you take less?", "Can I see it tomorrow?")),
            f"- {seller}: "
            + r.choice(
                (f"Yes, until {r.choice(WEEKDAYS)}.", "Sorry, the price is fixed.", "Sure, message me.")
            ),
        ]
        d.add("\n".join(lines), is_fact=True)
        if r.random() < 0.4:
            d.add(_chatter(d))
    if d.last_was_fact:
        d.add(_chatter(d))


def web_document(r: random.Random) -> str:
    d = Doc(r)
    target = target_words(r)
    n_questions = question_count(target)
    body_target = max(50, target - WORDS_PER_QA * n_questions - OVERSHOOT)
    layout = r.choices((_forum, _chat, _listings), weights=(5, 3, 2))[0]
    layout(d, body_target)  # each layout ends with a distractor, never right after a fact
    quiz(d, r.choice(WEB_QUIZ_HEADERS), n_questions)
    return d.text()
