"""The everyday words and phrases the corpus's templates draw from (a few hundred, so local regularities
are quickly learned). Part of the corpus definition: a change here changes the documents, and must bump
GENERATOR_VERSION."""

from __future__ import annotations

from rayb.data.corpus.invented import lines, phrases, words

DIRECTIONS = ("north", "south", "east", "west", "far north", "far south", "north-east", "south-west")
CITY_SIZES = ("small", "busy", "quiet", "large", "old", "walled", "hilly", "coastal", "crowded", "peaceful")


GOODS = phrases(
    """
    wool, glass, salt, timber, cheese, copper, paper, honey, rope, pottery, silk, olive oil, leather,
    clocks, boats, bells, carpets, apples
    """
)


JOBS = words(
    """
    painter engineer sailor teacher doctor baker astronomer mapmaker farmer musician builder botanist judge
    weaver blacksmith poet merchant nurse
    """
)


STUDY_TOPICS = phrases(
    """
    the stars, old roads, river fish, winter storms, mountain plants, ancient coins, the tides, bird songs,
    desert winds, village music, clay pots, the northern lights
    """
)


HABITATS = tuple(
    "the " + h
    for h in (
        "river banks",
        "high mountains",
        "dry grasslands",
        "pine forests",
        "salt marshes",
        "warm lakes",
        "deep caves",
        "rocky coasts",
        "open desert",
        "wet meadows",
        "tall reeds",
        "old orchards",
    )
)


COLORS = phrases(
    """
    red, blue, green, yellow, grey, brown, white, black, orange, purple, silver, pale pink, dark green,
    golden
    """
)


FOODS = phrases(
    """
    seeds, small fish, insects, leaves, berries, roots, grass, snails, worms, fruit, moss, mice, nuts,
    flowers
    """
)


# class -> (legs, what covers its body)
CREATURE_CLASSES = {
    "bird": (2, "feathers"),
    "lizard": (4, "scales"),
    "mammal": (4, "fur"),
    "beetle": (6, "shell"),
    "spider": (8, "hair"),
    "frog": (4, "skin"),
}


CREATURE_SIZES = ("small", "large", "shy", "fast", "slow", "noisy", "rare", "common", "clever", "gentle")
SUBSTANCE_KINDS = ("mineral", "metal", "salt", "crystal", "stone", "clay")


PRODUCTS = words(
    """
    mirrors coins paint medicine lamps bricks needles dyes bells glue windows pipes soap ink
    """
)


TOOL_KINDS = ("tool", "device", "small machine", "kind of basket", "kind of net", "instrument")
PURPOSES = lines(
    """
    measure the depth of water
    dry fish in the sun
    carry water up a hill
    count sheep at night
    sharpen old knives
    keep bread warm
    find the direction of the wind
    lift heavy stones
    sort seeds by size
    catch rain on a roof
    weigh gold dust
    mark the hours of the day
    """
)


SEASONS = ("spring", "summer", "autumn", "winter")
PEOPLE = words(
    """
    farmers students traders fishers children travellers builders families shepherds teachers
    """
)


ACTIVITIES = lines(
    """
    repair their tools
    gather wood for the cold months
    travel to the market
    plant new seeds
    read by the fire
    mend the roads
    clean the wells
    visit their neighbours
    count their animals
    store grain in dry barns
    paint their houses
    walk along the river
    """
)


CAREFUL_PEOPLE = ("builder", "cook", "sailor", "student", "doctor", "gardener", "pilot", "carpenter")
CHECK_VERBS = ("checks", "cleans", "measures", "tests", "counts", "inspects")


CHECK_THINGS = ("tools", "ropes", "numbers", "weather", "map", "water", "supplies", "notes")
BEFORE = phrases(
    """
    starting work, leaving home, going to sleep, setting out, writing the answer, opening the gate
    """
)


BUILT_THINGS = ("houses", "bridges", "boats", "roofs", "walls", "barns", "towers", "fences")
MATERIALS = ("stone", "wood", "clay", "brick", "iron", "reeds", "slate")


FRUITS = ("apples", "pears", "plums", "oranges", "lemons", "figs", "eggs", "books", "coins", "shells")
GENERAL_FACTS = lines(
    """
    Water freezes at zero degrees and boils at one hundred degrees.
    A week has seven days, and a year has twelve months.
    Plants use sunlight to turn water and air into food.
    The moon goes around the earth about once every month.
    Most birds build their nests in the spring.
    Rivers carry sand and small stones down to the sea.
    A triangle has three sides and three corners.
    Heat always moves from a warm object to a cold one.
    Maps usually show north at the top of the page.
    Sound travels faster through water than through air.
    Bees carry pollen from one flower to another.
    Iron rusts when it stays wet for a long time.
    A square has four equal sides and four equal corners.
    Clouds form when warm, wet air rises and cools.
    Farmers often change their crops each year to keep the soil healthy.
    Old roads were often built along rivers and valleys.
    A good experiment changes only one thing at a time.
    Writing things down helps us remember them later.
    Trade lets each town sell what it makes well and buy what it lacks.
    Many towns grew up where two roads crossed.
    Mountains are usually colder at the top than at the bottom.
    Some animals sleep through the winter to save energy.
    The sun rises in the east and sets in the west.
    A circle has no corners at all.
    Salt water is heavier than fresh water.
    Wind is air that moves from one place to another.
    Seeds need water, warmth and air before they can grow.
    Glass is made by heating sand until it melts.
    Every map needs a scale so that readers can measure distance.
    Light from the sun takes about eight minutes to reach the earth.
    """
)


DEFINITIONS = lines(
    """
    A harbour is a sheltered place where boats can stay safely.
    A valley is the low land between two hills or mountains.
    A census is an official count of the people who live in a place.
    A mayor is the person chosen to lead a town or a city.
    An export is something that a place makes and sells to other places.
    A delta is the flat land where a river splits before it reaches the sea.
    A fossil is the remains of a plant or an animal kept in rock.
    A telescope is a tool that makes far objects look closer.
    A habitat is the natural home of a plant or an animal.
    A mineral is a solid that forms naturally in the ground.
    A canal is a river that people have dug by hand or by machine.
    A recipe is a list of steps for making a dish.
    A century is a period of one hundred years.
    A border is the line where one country ends and another begins.
    An island is a piece of land with water all around it.
    """
)


# (title, steps); {n} and {m} are filled with small numbers so the same procedure varies a little.
PROCEDURES = (
    (
        "How to plant a young tree",
        (
            "Choose a place with plenty of sunlight.",
            "Dig a hole {n} times as wide as the roots.",
            "Place the tree in the hole and fill it with soil.",
            "Water the tree every day for the first {m} weeks.",
        ),
    ),
    (
        "How to make simple bread",
        (
            "Mix {n} cups of flour with one cup of warm water.",
            "Add a pinch of salt and a spoon of yeast.",
            "Knead the dough for {m} minutes.",
            "Let it rest for an hour, then bake it until it is golden.",
        ),
    ),
    (
        "How to read a map",
        (
            "Find the north arrow and turn the map to match it.",
            "Look at the scale to see how far {n} centimetres are.",
            "Find where you are now and where you want to go.",
            "Follow the roads and count the turns, {m} at a time.",
        ),
    ),
    (
        "How to find north at night",
        (
            "Wait until the sky is clear and dark.",
            "Find the brightest group of stars near the horizon.",
            "Follow the line they make for about {n} hand widths.",
            "The star you reach stays in the same place all night.",
        ),
    ),
    (
        "How to store grain",
        (
            "Dry the grain in the sun for {n} days.",
            "Clean a box or jar so that no insects are inside.",
            "Fill it to the top and close it tightly.",
            "Keep it in a cool place and check it every {m} weeks.",
        ),
    ),
    (
        "How to build a small raft",
        (
            "Collect {n} straight logs of the same length.",
            "Lay them side by side on flat ground.",
            "Tie them together with rope at both ends.",
            "Test the raft in shallow water with {m} people on it.",
        ),
    ),
    (
        "How to clean a small cut",
        (
            "Wash your hands with soap and water.",
            "Rinse the cut with clean water for {n} minutes.",
            "Cover it with a clean cloth.",
            "Change the cloth every {m} days until it heals.",
        ),
    ),
)


LESSON_OPENERS = lines(
    """
    In this lesson we will learn about {k} and the things found there.
    This chapter describes several places, people and living things of {k}.
    Read the text below carefully, because the questions at the end ask about it.
    The notes below were written for students who are new to the study of {k}.
    """
)


EDU_QUIZ_HEADERS = lines(
    """
    Review questions:
    Check your understanding.
    Questions:
    Let us review what we read.
    Quiz:
    Test yourself.
    """
)


ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen"
).split()


TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")


# Web vocabulary
ITEMS = phrases(
    """
    lamp, kettle, bike, tent, backpack, jacket, drill, chair, desk, camera, radio, blender, heater, ladder,
    kayak, guitar, printer, rug, mirror, clock, stove, scooter, telescope, sewing machine, lawn mower,
    toaster, fan, bookshelf, mattress, cooler
    """
)


ITEM_ADJS = words(
    """
    new small cheap second-hand heavy folding wooden black red big quiet
    """
)


GROCERIES = words(
    """
    bread milk rice coffee butter cheese eggs onions tomatoes flour soap tea honey lemons pasta beans
    """
)


PETS = ("dog", "cat", "parrot", "rabbit", "turtle", "goat", "hamster", "horse", "goldfish", "pony")
EVENTS = phrases(
    """
    book fair, bike race, music night, farmers market, flower show, chess club meeting, night run, food
    festival, film evening, boat parade
    """
)


NUMBER_KINDS = ("order", "ticket", "member", "locker", "booking", "invoice")
SPOTS = phrases(
    """
    the old bridge, the fountain, the train station, the north gate, the library steps, the fish market, the
    clock tower, the bus stop
    """
)


MONTHS = words(
    """
    January February March April May June July August September October November December
    """
)


WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
HANDLE_WORDS = words(
    """
    quiet blue lucky old happy rainy green tiny brave sleepy wild
    """
)


HANDLE_ANIMALS = ("otter", "fox", "owl", "crow", "bear", "wolf", "moth", "hare", "seal", "wren", "trout")
PARTS = ("battery", "switch", "cable", "filter", "fuse", "handle", "wheel", "belt", "plug", "screw")


RELATIVES = ("sister", "brother", "neighbour", "uncle", "aunt", "cousin", "friend", "dad", "mum")
TIPS = lines(
    """
    keep the receipt
    read the manual first
    ask for the price in writing
    check the reviews
    buy it on a weekday
    test it in the shop
    measure the space at home
    wait for the sale
    bring a friend who knows
    compare three shops
    look for a warranty
    clean it once a month
    """
)


THREAD_TITLES = lines(
    """
    Best place to buy a {item} near {town}?
    My first weeks with a {item}
    Moving to {town} next month, any advice?
    Anyone going to the {event}?
    Help: my {item} stopped working
    What are you all buying this {season}?
    Weekend plans in {town}
    """
)


CHATTER = lines(
    """
    Thanks for the tip, I will try that tonight.
    Has anyone else had this problem with a {item}?
    Same here. Mine stopped working after {n} days.
    I would wait for the {month} sale, prices drop a lot.
    Not sure I agree, but it depends on what you need.
    Welcome to the forum!
    Edit: fixed the link.
    Good question. I have been wondering about that too.
    Shipping to {town} took {n} days for me.
    Check the {part} first, that is usually the problem.
    Honestly the cheaper one works just as well.
    Can you post a photo?
    I called the shop and they told me to come back on {weekday}.
    That sounds about right to me.
    Ha, I did the exact same thing last {weekday}.
    Read the manual, page {n} explains it.
    My {relative} has one and loves it.
    The {part} on mine broke after a year, so be careful.
    """
)


WEB_QUIZ_HEADERS = lines(
    """
    Quick quiz about this thread:
    Questions about the text above:
    Do you remember?
    Summary check:
    Reader questions:
    """
)


CHAT_SMALL_TALK = (
    ("User: Thanks, that was quick.", "Reply: You are welcome. Is there anything else?"),
    ("User: Can I pay by card?", "Reply: Yes, we take cards and cash on delivery."),
    ("User: Sorry, my internet is slow today.", "Reply: No problem, take your time."),
    ("User: Do you also sell spare parts?", "Reply: We do, for example a new {part}."),
    ("User: Is the shop open on {weekday}?", "Reply: Yes, from nine until six."),
    ("User: How do I return something?", "Reply: Bring it back within {n} days with the receipt."),
)
