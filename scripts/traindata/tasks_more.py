"""More kinds of the "tasks" source (added 2026-11-28): coding requests,
reasoning puzzles, summaries of a given text and questions about a given
passage, the kinds people ask a chat model that tasks.py lacked. Generated
from templates and lists written for this project, numbers and names from a
seeded generator, and passages from the other sources (the Python
documentation's paragraphs; chitchat-dataset's longer first turns).
"""
import re

LANGS = ["Python", "Python", "Python", "JavaScript", "C", "Go", "Rust", "Java"]
SPECS = [
    "reverses the words of a sentence", "counts the vowels in a string", "returns the n-th Fibonacci number",
    "merges two sorted lists into one sorted list", "checks whether a string is a palindrome",
    "removes duplicate items from a list while keeping their order", "finds the largest number in a list",
    "converts a temperature from Celsius to Fahrenheit", "computes the factorial of n",
    "checks whether a number is prime", "returns the greatest common divisor of two integers",
    "flattens a nested list", "counts how often each word occurs in a text",
    "capitalises the first letter of every word", "returns the second largest number in a list",
    "checks whether two strings are anagrams", "sums the digits of an integer",
    "converts a Roman numeral to an integer", "converts an integer to binary without built-ins",
    "finds the longest word in a sentence", "returns the average of a list of numbers",
    "rotates a list by k positions", "checks whether brackets in a string are balanced",
    "returns the intersection of two lists", "splits a list into chunks of size n",
    "computes the running total of a list", "finds the index of a value with binary search",
    "sorts a list of dictionaries by a key", "validates a simple email address",
    "transposes a matrix given as a list of lists", "returns all even numbers from a list",
    "computes compound interest", "counts the lines, words and characters of a file",
    "parses a CSV line into fields", "returns the most common element of a list",
    "generates all subsets of a small set", "checks whether a year is a leap year",
    "removes punctuation from a string", "computes the distance between two points",
    "implements a stack with push, pop and peek", "implements a simple queue",
    "converts a dictionary into a list of key-value pairs sorted by value",
    "finds the missing number in a list of 1..n", "returns the n smallest items of a list",
]
CODE_FORMS = [
    "Write a {lang} function that {spec}.",
    "Write a {lang} function that {spec}. Include a short docstring or comment and one example call.",
    "How do I write a function in {lang} that {spec}? Explain the code.",
    "Write a {lang} function that {spec}, and give two test cases for it.",
]
CODE_ASKS = [
    "What is the difference between a list and a tuple in Python?",
    "Explain recursion with a simple example.", "What does a hash table do, and why is lookup fast?",
    "Explain the difference between a compiled and an interpreted language.",
    "What is Big-O notation? Give three examples.", "When should I use a class instead of a function?",
    "Explain what an API is to a beginner.", "What is the difference between git merge and git rebase?",
    "How does garbage collection work, in simple terms?", "What are unit tests and why write them?",
    "Explain the difference between SQL's INNER JOIN and LEFT JOIN with an example.",
    "What is a race condition, and how can it be avoided?",
]
NAMES = ["Ana", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jon", "Kai", "Lena",
         "Maya", "Nico", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tara"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
TRAITS = [("taller", "tallest", "shortest"), ("older", "oldest", "youngest"), ("faster", "fastest", "slowest")]
SYLLOGISMS = [
    ("All birds have feathers", "A penguin is a bird", "Does a penguin have feathers?"),
    ("No reptiles have fur", "A snake is a reptile", "Does a snake have fur?"),
    ("All squares are rectangles", "Some rectangles are not squares", "Are all rectangles squares?"),
    ("Every student in the class passed the test", "Mia is in the class", "Did Mia pass the test?"),
    ("If it rains, the street gets wet", "The street is wet", "Did it necessarily rain?"),
    ("If a number is divisible by 4, it is even", "14 is even", "Is 14 divisible by 4?"),
    ("All roses are flowers", "Some flowers fade quickly", "Do some roses necessarily fade quickly?"),
    ("Only members may enter the club", "Leo entered the club", "Is Leo a member?"),
]
RIDDLES = [
    "A bat and a ball cost $1.10 in total. The bat costs $1.00 more than the ball. How much does the ball cost?",
    "If it takes 5 machines 5 minutes to make 5 widgets, how long would 100 machines take to make 100 widgets?",
    "A farmer has 17 sheep, and all but 9 run away. How many are left?",
    "I have two coins that add up to 30 cents, and one of them is not a nickel. What are the coins?",
    "How many times can you subtract 5 from 25?",
    "A clock shows 3:15. What is the angle between the hour and the minute hands?",
]
SUMMARY_FORMS = [
    "Summarise the following text in two sentences:\n\n", "Summarize this in one paragraph:\n\n",
    "TL;DR of the following:\n\n", "Write a three-bullet summary of this text:\n\n",
    "Summarise the main idea of this text for a busy reader:\n\n",
]
QA_GENERIC = [
    "What is the main point of the passage?", "What problem does the passage describe, and what is its solution?",
    "According to the passage, what should a reader be careful about?",
    "Which example does the passage give, and what does it show?",
]


def reasoning_prompt(rng):
    """One reasoning puzzle of six kinds, consistent by construction."""
    k = rng.randrange(6)
    if k == 0:
        a, b, c = rng.sample(NAMES, 3)
        cmp_, most, least = rng.choice(TRAITS)
        ask = rng.choice([most, least])
        return f"{a} is {cmp_} than {b}, and {b} is {cmp_} than {c}. Who is the {ask}? Explain your reasoning."
    if k == 1:
        p, q, ask = rng.choice(SYLLOGISMS)
        return f"{p}. {q}. {ask} Explain your reasoning step by step."
    if k == 2:
        d, n = rng.randrange(7), rng.randint(2, 40)
        return f"Today is {DAYS[d]}. What day of the week will it be in {n} days? Explain how you worked it out."
    if k == 3:
        a, b = rng.sample(NAMES, 2)
        x, y, age = rng.randint(3, 15), rng.randint(2, 6), rng.randint(4, 12)
        return (f"{a} is {y} times as old as {b}, who is {age} now. How old is {a} now, and how old "
                f"will each of them be in {x} years? Is {a} still {y} times as old then?")
    if k == 4:
        return rng.choice(RIDDLES) + " Think it through before answering."
    a, b, c = rng.sample(NAMES, 3)
    return (f"{a}, {b} and {c} each own one pet: a cat, a dog or a fish. {a} does not own the dog. "
            f"{b} owns the fish. Who owns which pet? Explain step by step.")


def name_in(p):
    """A Python name the passage mentions (dotted or called), or None."""
    m = re.search(r"\b([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+|[A-Za-z_]\w*\(\))", p)
    return m.group(1) if m else None


def more_tasks(rng, chitchat, paragraphs):
    """[(prompt, kind, origin)] of the kinds coding, reasoning, summary and
    passage-qa; paragraphs: documentation paragraphs the other kinds left."""
    out = []
    for i, s in enumerate(SPECS):
        for j, form in enumerate(CODE_FORMS):
            for lang in (LANGS[(i * 3 + j) % len(LANGS)], LANGS[(i * 3 + j + 3) % len(LANGS)]):
                out.append((form.format(lang=lang, spec=s), "coding", "tasks_more.py"))
    out += [(q, "coding", "tasks_more.py") for q in CODE_ASKS]
    out += [(reasoning_prompt(rng), "reasoning", "tasks_more.py") for _ in range(900)]
    long_turns = [s for s in chitchat if len(s) > 240]
    ps = [p for p in paragraphs if len(p) >= 300]   # already shuffled, and not used by tasks.py
    half = min(700, len(ps) // 2)
    texts = ps[:half] + long_turns[:300]
    for i, t in enumerate(texts):
        out.append((SUMMARY_FORMS[i % len(SUMMARY_FORMS)] + t, "summary",
                    "python3-doc" if i < half else "dataset.json"))
    for i, p in enumerate(ps[half:half + 800]):
        n = name_in(p)
        q = (f"What does the passage say about {n}?" if n and i % 2 == 0 else QA_GENERIC[i % len(QA_GENERIC)])
        out.append((f"Read the passage and answer the question.\n\nPassage: {p}\n\nQuestion: {q}",
                    "passage-qa", "python3-doc"))
    return out
