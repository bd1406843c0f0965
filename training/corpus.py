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

# The built-in compare prompts (ddtree_ops/prompts.py) appear verbatim among the prompts.
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

TOPICS = {
    "why the sea looks blue": [
        "The sea looks blue because water absorbs red light more strongly than blue light.",
        "Sunlight contains every colour, and as it travels through water the longer red wavelengths fade first.",
        "The blue light that remains is scattered back towards our eyes.",
        "The sky reflected on the surface adds to the effect on a clear day.",
        "In shallow or muddy water the colour shifts towards green or brown.",
    ],
    "why the sky is blue": [
        "The sky is blue because air molecules scatter short blue wavelengths of sunlight more than red ones.",
        "This effect is called Rayleigh scattering.",
        "When we look away from the sun, we see this scattered blue light from every direction.",
        "At sunset the light crosses more air, so the blue is scattered away and the sky turns red and orange.",
        "On a hazy day larger particles scatter all colours and the sky looks paler.",
    ],
    "why leaves are green": [
        "Leaves are green because they contain chlorophyll.",
        "Chlorophyll absorbs red and blue light to power photosynthesis.",
        "It reflects most of the green light, which is the colour we see.",
        "In autumn the chlorophyll breaks down and yellow and orange pigments show through.",
        "Some plants have red leaves because other pigments hide the green.",
    ],
    "how a computer stores numbers": [
        "A computer stores numbers as patterns of bits, each of which is either zero or one.",
        "Whole numbers are written in binary, where each bit stands for a power of two.",
        "Negative numbers usually use a scheme called two's complement.",
        "Fractions are stored as floating point numbers with a sign, an exponent and a mantissa.",
        "The more bits a number has, the larger the range of values it can hold.",
    ],
    "why cats sleep so much": [
        "Cats sleep for twelve to sixteen hours a day.",
        "As hunters, they save energy for short bursts of activity.",
        "Much of their sleep is light, so they can wake quickly.",
        "Kittens and old cats sleep even more than adults.",
        "A warm and safe place makes a cat sleep longer.",
    ],
}


def chat(prompt: str, answer: str) -> str:
    """ChatML, exactly as the lab tokenizer's chat template renders a user turn plus the reply."""
    return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>\n"


def code_sample(rng: random.Random) -> tuple[str, str]:
    name = rng.choice(list(FUNCTIONS))
    what, body = FUNCTIONS[name]
    if name == "fibonacci" and rng.random() < 0.5:
        prompt = FIB_PROMPT
    else:
        verb = rng.choice(["Write", "Write a short", "Implement"])
        prompt = f"{verb} a Python function {name} that returns {what}."
        prompt = prompt.replace("a short a ", "a short ")
    return prompt, f"```python\n{body}```"


def add_sample(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.2:
        a, b = 2, 2
    else:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
    return ADD_PROMPT.format(a=a, b=b), str(a + b)


def steps_sample(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.2:
        terms = [17, 25, 38, 12]
    else:
        terms = [rng.randint(1, 60) for _ in range(rng.randint(3, 5))]
    lines = []
    total = terms[0]
    for t in terms[1:]:
        lines.append(f"{total} + {t} = {total + t}")
        total += t
    answer = "\n".join(lines) + f"\nThe total is {total}."
    return STEPS_PROMPT.format(terms=" + ".join(str(t) for t in terms)), answer


def json_sample(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.2:
        name, age, langs = "Ada", 36, ["en", "fr"]
    else:
        name, age = rng.choice(NAMES), rng.randint(18, 80)
        langs = rng.sample(LANGS, rng.randint(1, 3))
    doc = {"name": name, "age": age, "languages": langs}
    out = dict(doc, age=age + 1)
    return JSON_PROMPT.format(doc=json.dumps(doc)), json.dumps(out)


def prose_sample(rng: random.Random) -> tuple[str, str]:
    topic = rng.choice(list(TOPICS))
    sentences = TOPICS[topic]
    # The first three sentences always come in order; the rest vary, so replies differ.
    picked = sentences[:3] + rng.sample(sentences[3:], rng.randint(0, 2))
    return PROSE_PROMPT.format(topic=topic), " ".join(picked)


FAMILIES = (code_sample, add_sample, steps_sample, json_sample, prose_sample)


def build_corpus(num_samples: int, seed: int = 0) -> list[str]:
    """`num_samples` chat transcripts, round-robin over the families, reproducible from `seed`."""
    rng = random.Random(seed)
    return [chat(*FAMILIES[i % len(FAMILIES)](rng)) for i in range(num_samples)]


if __name__ == "__main__":
    for text in build_corpus(10):
        print(text)
