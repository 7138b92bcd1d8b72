"""The "tasks" source of stage a: instructions of the kinds people give a chat
model that the other sources lack (writing, role play, arithmetic and word
problems, translation, extraction, rewriting; and, as the source "tasks2",
coding, reasoning, summaries and questions about a passage: tasks_more.py), so that a head trained on the
answers has seen such text. Everything here is generated: templates and word
lists written for this project, numbers from a seeded generator, and sentences
and passages taken from the other sources (chitchat-dataset's first turns, the
Python documentation's paragraphs), whose licences the manifest records.
Nothing comes from Spec-Bench (stage a's exclusion still checks every prompt).
"""
import random

from .tasks_more import more_tasks

TOPICS = [
    "a lighthouse keeper's last night on duty", "learning to cook at forty", "a city without cars",
    "the first day at a new school", "a robot that wants to paint", "winter in a mountain village",
    "an old bicycle", "moving to another country", "a library that never closes", "a lost umbrella",
    "the smell of rain", "a chess tournament", "growing tomatoes on a balcony", "a night train",
    "a friendship that began online", "the ocean at dawn", "a grandmother's recipe book",
    "working from home", "a power cut during a storm", "a marathon runner's last mile",
    "a small bakery", "a museum at night", "the invention of the printing press", "a desert crossing",
    "a family road trip", "a forgotten song", "a new neighbour", "the end of summer", "a broken clock",
    "a volunteer firefighter", "a garden in the city", "a street musician", "the first snow",
    "a bridge between two towns", "a job interview", "a beekeeper", "a long-distance phone call",
    "a kite festival", "an abandoned railway station", "a science fair", "a village market",
    "a dog who learns to swim", "the last bookshop in town", "a wedding in the rain",
    "a fisherman and a storm", "climbing a volcano", "a teacher's first class", "a solar eclipse",
    "a recycling campaign", "time management for students", "the benefits of walking",
    "saving money on groceries", "learning a second language", "the history of coffee",
    "renewable energy at home", "a healthy breakfast", "sleep and memory", "public transport",
    "remote teams", "online privacy", "a balanced diet", "the importance of reading to children",
    "electric cars", "board games", "urban gardening", "the role of museums", "volunteering",
    "digital detox", "minimalism", "open-source software", "space exploration", "honeybees",
]
FORMS = [
    "Write a short story about {t}.", "Write a poem about {t}.", "Write a haiku about {t}.",
    "Write a blog post about {t}.", "Write a persuasive paragraph about {t}.",
    "Write a short speech about {t}.", "Write a diary entry about {t}.",
    "Write the opening paragraph of a novel about {t}.", "Write a limerick about {t}.",
    "Write a product description inspired by {t}.", "Write a letter to a friend about {t}.",
    "Write five tips about {t}.", "Write a dialogue between two people about {t}.",
    "Write a short news article about {t}.", "Give me three title ideas for an essay about {t}.",
]
EMAILS = [
    "asking my manager for a day off next Friday", "thanking a colleague for help with a project",
    "apologising to a customer for a late delivery", "inviting the team to a farewell lunch",
    "asking a landlord to repair the heating", "following up after a job interview",
    "declining a meeting politely", "asking a teacher about my child's progress",
    "requesting a refund for a broken kettle", "announcing a new office opening hour",
]
ROLES = [
    "a pirate captain", "a tour guide in Rome", "a medieval knight", "a detective in 1920s London",
    "a friendly librarian", "a personal fitness coach", "a chef in a busy kitchen", "an astronaut on Mars",
    "a wise old wizard", "a football commentator", "a travel agent", "a customer support agent",
    "a museum curator", "a park ranger", "a nervous first-time actor", "a grumpy cat",
    "a job interviewer", "a history teacher", "a sports journalist", "a shopkeeper in a small town",
]
LANGS = ["French", "German", "Spanish", "Italian", "Portuguese", "Dutch", "Chinese", "Japanese"]
PASSAGE_TASKS = [
    "Extract every Python name (module, class, function or parameter) mentioned in this passage, one per line:\n\n",
    "List the key facts in this passage as bullet points:\n\n",
    "Return a JSON object with the keys \"topic\" and \"keywords\" for this passage:\n\n",
    "Write three questions that this passage answers, with their answers:\n\n",
    "Rewrite this passage for a beginner, in at most three sentences:\n\n",
    "Give this passage a short title and a one-sentence summary:\n\n",
]
SENTENCE_TASKS = [
    "Rewrite this sentence in a formal tone: ", "Correct the grammar and spelling of this text: ",
    "Rewrite this more concisely: ", "What is the sentiment of this message (positive, negative or neutral)? ",
    "Reply to this message as a helpful assistant: ",
]
ITEMS = [("apples", 0.4, 2.5), ("notebooks", 1.5, 6), ("tickets", 8, 40), ("books", 5, 25),
         ("coffees", 2, 5), ("shirts", 10, 35), ("plants", 3, 20), ("pens", 0.5, 3)]
NAMES = ["Ana", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jon", "Kai", "Lena"]


def math_prompt(rng):
    """One arithmetic prompt of ten kinds; the numbers are drawn before the kind is used."""
    k = rng.randrange(10)
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 12)
    n = rng.choice(NAMES)
    item, lo, hi = rng.choice(ITEMS)
    price = round(rng.uniform(lo, hi), 2)
    note = (int(c * price) // 10 + 1) * 10
    kinds = [
        f"What is {a} * {b} + {c}? Show your steps.",
        f"Solve for x: {c}x + {a} = {a + c * b}. Explain each step.",
        f"{n} buys {c} {item} at ${price:.2f} each and pays with a ${note} note. How much change does {n} get?",
        f"What is {a}% of {b * 10}? Explain how you got the answer.",
        f"A train travels {a * 3} km in {c} hours. What is its average speed, and how far does it go "
        f"in {c + 2} hours at that speed?",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
        f"{n} has {a + b} marbles and gives {a} of them to a friend, then buys {c} more. "
        f"How many marbles does {n} have now?",
        f"What is the next number in the sequence {c}, {2 * c}, {4 * c}, {8 * c}, ...? Explain the pattern.",
        f"Is {a * b + 1} a prime number? Explain how to check.",
        f"Convert {a * 7} minutes into hours and minutes, and {b * 100} grams into kilograms.",
    ]
    return kinds[k]


def tasks_prompts(chitchat, paragraphs, seed):
    """([(prompt, kind, origin)] of tasks, the same of tasks2): chitchat =
    [text] (first turns), paragraphs = [text] (documentation paragraphs);
    both may be empty."""
    rng = random.Random(f"{seed}:tasks")
    out = []
    for t in TOPICS:
        for f in FORMS:
            out.append((f.format(t=t), "writing", "tasks.py"))
    for e in EMAILS:
        out.append((f"Write an email {e}.", "writing", "tasks.py"))
    out += [(math_prompt(rng), "math", "tasks.py") for _ in range(1500)]
    short = [s for s in chitchat if 20 <= len(s) <= 240]
    rng.shuffle(short)
    for i, s in enumerate(short[:1500]):
        out.append((f"Translate into {LANGS[i % len(LANGS)]}: {s}", "translation", "dataset.json"))
    for i, s in enumerate(short[1500:2500]):
        out.append((SENTENCE_TASKS[i % len(SENTENCE_TASKS)] + s, "rewriting", "dataset.json"))
    qs = [s for s in chitchat if s.rstrip().endswith("?") and len(s) <= 200]
    rng.shuffle(qs)
    for i, q in enumerate(qs[:800]):
        out.append((f"Pretend you are {ROLES[i % len(ROLES)]} and stay in character. {q}", "roleplay",
                    "dataset.json"))
    ps = list(paragraphs)
    rng.shuffle(ps)
    for i, p in enumerate(ps[:1500]):
        out.append((PASSAGE_TASKS[i % len(PASSAGE_TASKS)] + p, "extraction", "python3-doc"))
    # coding, reasoning, summaries and questions about a passage (2026-11-28),
    # the source "tasks2": drawn after the kinds above, so that their prompts
    # stay as they were; on the paragraphs extraction left (all of them in a
    # small sampled run)
    return out, more_tasks(rng, chitchat, ps[1500:] if len(ps) >= 1600 else ps)
