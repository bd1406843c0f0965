"""A synthetic, reproducible chat corpus for the lab model pair.

Everything is generated from a seed, so the corpus is redistributable and the same on every
machine. Its four families mirror `ddtree-ops compare`'s built-in prompts (code, arithmetic,
JSON, prose), so the lab demo's numbers mean something: each family has a memorisable part
(templates) and a part the model must compute or choose (numbers, names, word choices), which
is where a drafter becomes uncertain and a tree beats a chain.
"""

from __future__ import annotations

import json
import random
import re

# The built-in compare prompts (ddtree_ops/compare/prompts.py) appear verbatim among the prompts.
FIB_PROMPT = "Write a Python function fibonacci(n) that returns the n-th Fibonacci number iteratively."
ADD_PROMPT = "What is {a}+{b}? Answer with the number only."
STEPS_PROMPT = "Compute {terms} step by step, then give the total."
JSON_PROMPT = "Parse this JSON and return it with the age increased by one, as JSON only: {doc}"
PROSE_PROMPT = "Write a short paragraph about {topic}."

FUNCTIONS = {
    "fibonacci": (
        "the n-th Fibonacci number iteratively",
        "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    ),
    "factorial": (
        "the factorial of n iteratively",
        "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result\n",
    ),
    "sum_list": (
        "the sum of a list of numbers",
        "def sum_list(values):\n    total = 0\n    for value in values:\n        total += value\n    return total\n",
    ),
    "is_prime": (
        "whether n is a prime number",
        "def is_prime(n):\n    if n < 2:\n        return False\n    for i in range(2, int(n ** 0.5) + 1):\n"
        "        if n % i == 0:\n            return False\n    return True\n",
    ),
    "reverse_string": (
        "the string s reversed",
        "def reverse_string(s):\n    return s[::-1]\n",
    ),
    "max_value": (
        "the largest number in a list",
        "def max_value(values):\n    best = values[0]\n    for value in values[1:]:\n        if value > best:\n"
        "            best = value\n    return best\n",
    ),
    "count_vowels": (
        "the number of vowels in a string",
        "def count_vowels(s):\n    count = 0\n    for ch in s.lower():\n        if ch in \"aeiou\":\n"
        "            count += 1\n    return count\n",
    ),
}

NAMES = ["Ada", "Alan", "Grace", "Linus", "Barbara", "Ken", "Dennis", "Margaret", "Edsger", "Frances", "John", "Radia"]
LANGS = ["en", "fr", "de", "es", "it", "ja", "pt", "nl"]

# Prose templates: {a|b|c} is a free choice made per sample, so the replies branch every few
# words and a drafter's top-1 guess is often wrong where its top-2 or top-3 is right.
TOPICS = {
    "why the sea looks blue": [
        "The sea {looks|appears|seems} blue because water {absorbs|soaks up|takes in} red light more {strongly|readily} than blue light.",
        "Sunlight {contains|carries|holds} every colour, and as it {travels|passes|moves} through water the {longer|warmer} red wavelengths fade first.",
        "The blue light that {remains|is left|survives} is {scattered|sent|bounced} back towards our eyes.",
        "The sky {reflected|mirrored} on the surface {adds to|deepens|strengthens} the effect on a {clear|bright|sunny} day.",
    ],
    "why the sky is blue": [
        "The sky is blue because {air|gas} molecules scatter {short|small} blue wavelengths of sunlight more than {red|long} ones.",
        "This {effect|process} is called Rayleigh scattering.",
        "When we look away from the sun, we {see|notice|catch} this scattered blue light from every direction.",
        "At sunset the light {crosses|travels through} more air, so the sky turns {red|orange|pink}.",
    ],
    "why leaves are green": [
        "Leaves are green because they {contain|hold|are full of} chlorophyll.",
        "Chlorophyll {absorbs|captures|takes in} red and blue light to {power|drive|fuel} photosynthesis.",
        "It {reflects|returns|bounces back} most of the green light, which is the colour we {see|notice}.",
        "In autumn the chlorophyll {breaks down|fades|disappears} and {yellow|orange|golden} pigments show through.",
    ],
    "how a computer stores numbers": [
        "A computer {stores|keeps|holds} numbers as patterns of bits, each of which is either zero or one.",
        "Whole numbers are {written|stored|kept} in binary, where each bit {stands for|represents|means} a power of two.",
        "Negative numbers {usually|often|mostly} use a scheme called two's complement.",
        "Fractions are {stored|kept|held} as floating point numbers with a sign, an exponent and a mantissa.",
    ],
    "why cats sleep so much": [
        "Cats {sleep|rest|doze} for twelve to sixteen hours a day.",
        "As hunters, they {save|keep|store} energy for short bursts of {activity|action|play}.",
        "Much of their sleep is {light|shallow}, so they can {wake|get up|spring up} quickly.",
        "A {warm|safe|quiet} place makes a cat sleep {longer|more|deeper}.",
    ],
}

_CHOICE = re.compile(r"\{([^{}]*\|[^{}]*)\}")


def fill(template: str, rng: random.Random) -> str:
    """Replace every {a|b|c} slot with one option."""
    return _CHOICE.sub(lambda m: rng.choice(m.group(1).split("|")), template)


def chat(prompt: str, answer: str) -> str:
    """ChatML, exactly as the lab tokenizer's chat template renders a user turn plus the reply."""
    return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>\n"


def code_sample(rng: random.Random) -> tuple[str, str]:
    name = rng.choice(list(FUNCTIONS))
    what, body = FUNCTIONS[name]
    if name == "fibonacci" and rng.random() < 0.3:
        prompt = FIB_PROMPT
    else:
        verb = rng.choice(["Write", "Write a short", "Implement"])
        prompt = f"{verb} a Python function {name} that returns {what}."
        prompt = prompt.replace("a short a ", "a short ")
    var = rng.choice(["a, b", "x, y", "prev, curr"])
    body = body.replace("a, b = 0, 1", f"{var} = 0, 1").replace("a, b = b, a + b", "{0}, {1} = {1}, {0} + {1}".format(*var.split(", ")))
    if name == "fibonacci":
        body = body.replace("    return a\n", f"    return {var.split(', ')[0]}\n")
    doc = rng.choice(["", f'    """Return {what}."""\n', f"    # {what}\n"])
    header, rest = body.split("\n", 1)
    intro = rng.choice(["", "Here is the function:\n\n", "Sure:\n\n", "Here is one way to do it:\n\n"])
    return prompt, f"{intro}```python\n{header}\n{doc}{rest}```"


def add_sample(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    return ADD_PROMPT.format(a=a, b=b), str(a + b)


def steps_sample(rng: random.Random) -> tuple[str, str]:
    terms = [rng.randint(1, 60) for _ in range(rng.randint(3, 5))]
    lines = [rng.choice(["Step by step:", "Let's add them one at a time.", "Adding in order:"])]
    total = terms[0]
    for t in terms[1:]:
        lines.append(f"{total} + {t} = {total + t}")
        total += t
    lines.append(rng.choice(["The total is {}.", "So the total is {}.", "Total: {}."]).format(total))
    answer = "\n".join(lines)
    return STEPS_PROMPT.format(terms=" + ".join(str(t) for t in terms)), answer


def json_sample(rng: random.Random) -> tuple[str, str]:
    name, age = rng.choice(NAMES), rng.randint(18, 80)
    langs = rng.sample(LANGS, rng.randint(1, 3))
    doc = {"name": name, "age": age, "languages": langs}
    out = dict(doc, age=age + 1)
    return JSON_PROMPT.format(doc=json.dumps(doc)), json.dumps(out)


def prose_sample(rng: random.Random) -> tuple[str, str]:
    topic = rng.choice(list(TOPICS))
    return PROSE_PROMPT.format(topic=topic), " ".join(fill(t, rng) for t in TOPICS[topic])


FAMILIES = (code_sample, add_sample, steps_sample, json_sample, prose_sample)


def build_corpus(num_samples: int, seed: int = 0) -> list[str]:
    """`num_samples` chat transcripts, round-robin over the families, reproducible from `seed`."""
    rng = random.Random(seed)
    return [chat(*FAMILIES[i % len(FAMILIES)](rng)) for i in range(num_samples)]


if __name__ == "__main__":
    for text in build_corpus(10):
        print(text)
