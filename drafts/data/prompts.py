"""Prompts written for distillation and evaluation: chat questions, code tasks, agent tool loops.

Each family is composed from a topic list and a set of phrasings. The train / held-out split is
by topic (a stable hash, as for stdlib files): held-out prompts are about subjects the draft
never saw in training, not rephrasings of them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from drafts.data.stdlib import is_held_out

CHAT_TOPICS: tuple[str, ...] = (
    "photosynthesis", "the water cycle", "black holes", "the French Revolution", "compound interest",
    "how vaccines work", "the stock market", "climate change", "the Roman Empire", "machine learning",
    "the immune system", "plate tectonics", "the printing press", "inflation", "the moon landing",
    "renewable energy", "DNA", "the Internet", "volcanoes", "the human heart", "gravity", "electricity",
    "the Renaissance", "coffee", "sleep", "bees", "the Great Wall of China", "recycling", "rainbows",
    "the Olympic Games", "chess", "the piano", "time zones", "earthquakes", "the ocean tides", "bread baking",
    "meditation", "the solar system", "antibiotics", "supply and demand", "democracy", "the camera",
    "dinosaurs", "the Amazon rainforest", "nutrition", "public speaking", "learning a new language",
    "budgeting", "job interviews", "gardening", "running a marathon", "the speed of light", "magnets",
    "airplanes", "batteries", "the periodic table", "evolution", "cloud computing", "encryption",
    "password security", "email etiquette", "time management", "teamwork", "writing a resume", "the Moon",
    "Mars", "glaciers", "deserts", "honey", "cheese making", "tea", "the violin", "jazz", "poetry",
    "Shakespeare", "ancient Egypt", "the Silk Road", "the Industrial Revolution", "World War I",
    "the Cold War", "the United Nations", "human rights", "philosophy", "logic puzzles", "probability",
    "prime numbers", "fractions", "geometry", "statistics", "the Pythagorean theorem", "calculus",
    "spreadsheets", "databases", "open source software", "smartphones", "social media", "video games",
    # Added 2026-12-02 for the third training round (more chat: the weakest kind).
    "electric cars", "origami", "the human brain", "friendship", "penguins", "mountains", "hurricanes",
    "snowflakes", "wind turbines", "solar panels", "nuclear power", "the metric system", "clocks",
    "calendars", "lighthouses", "trains", "bicycles", "submarines", "rockets", "satellites", "telescopes",
    "microscopes", "bacteria", "viruses", "coral reefs", "wolves", "elephants", "whales", "owls",
    "butterflies", "ants", "sharks", "octopuses", "horses", "the Sahara", "Antarctica", "the Nile",
    "the Himalayas", "Japan", "Brazil", "Canada", "India", "Australia", "ancient Greece", "the Vikings",
    "the Aztecs", "the Middle Ages", "Leonardo da Vinci", "Albert Einstein", "Marie Curie", "Isaac Newton",
    "Charles Darwin", "Mozart", "watercolor painting", "photography", "knitting", "woodworking", "chocolate",
    "spices", "vegetarian diets", "yoga", "swimming", "soccer", "basketball", "tennis", "saving money",
    "credit cards", "taxes", "insurance", "renting an apartment", "buying a used car", "moving to a new city",
    "parenting", "studying for exams", "taking notes", "writing a novel", "folk music", "rock music", "opera",
    "movies", "theater", "museums", "libraries", "newspapers", "radio", "television", "robots",
    "artificial intelligence", "virtual reality", "3D printing", "blockchain", "operating systems",
    "compilers", "computer networks", "Linux", "web browsers", "search engines", "quantum computing",
    "semiconductors", "lasers", "sound waves", "thermodynamics", "atoms", "the human eye", "digestion",
    "bones", "muscles", "allergies", "the common cold", "stress", "happiness", "habits", "procrastination",
    "negotiation", "leadership", "customer service", "starting a small business", "marketing", "economics",
    "globalization", "banks", "urban planning", "architecture", "bridges", "skyscrapers", "first aid",
    "fire safety", "camping", "board games", "magic tricks", "astronomy", "the northern lights", "comets",
    # Added 2026-12-02 for the fourth training round (chat is still the weakest kind).
    "thunderstorms", "tornadoes", "fossils", "crystals", "rivers", "lakes", "islands", "caves", "forests",
    "wetlands", "soil", "composting", "beekeeping", "farming", "irrigation", "fishing", "sailing",
    "kayaking", "rock climbing", "skiing", "cycling for commuters", "walking every day", "stretching",
    "posture", "hydration", "vitamins", "sunscreen", "dental care", "hearing", "memory", "dreams",
    "emotions", "empathy", "curiosity", "creativity", "motivation", "gratitude", "patience", "kindness",
    "mentoring", "volunteering", "public libraries", "town councils", "elections", "courts", "juries",
    "constitutions", "the Magna Carta", "the printing of money", "the gold standard", "stock options",
    "retirement savings", "mortgages", "index funds", "freelancing", "remote work", "job promotions",
    "office meetings", "project management", "giving feedback", "conflict resolution", "apologizing",
    "small talk", "wedding planning", "birthday parties", "gift giving", "traveling on a budget",
    "learning to cook", "knife skills", "fermentation", "pasta", "rice", "soup", "baking cookies",
    "street food", "the Mediterranean diet", "olive oil", "potatoes", "tomatoes", "mushrooms", "apples",
    "the printing of books", "typewriters", "fountain pens", "calligraphy", "sculpture", "pottery",
    "ballet", "hip hop", "the guitar", "drums", "orchestras", "choirs", "film scores", "animation",
    "comic books", "science fiction", "mystery novels", "fairy tales", "mythology", "ancient Rome's roads",
    "the Byzantine Empire", "the Ottoman Empire", "the Mongol Empire", "the Incas", "the Maya",
    "the age of exploration", "the steam engine", "the telegraph", "the telephone", "the light bulb",
    "vaccination campaigns", "sanitation", "clean water", "hospitals", "nursing", "pharmacies",
    "the scientific method", "peer review", "experiments", "hypotheses", "graphs", "averages",
    "percentages", "ratios", "negative numbers", "infinity", "algebra", "trigonometry", "matrices",
    "sorting algorithms", "recursion", "version control", "unit testing", "code review", "web APIs",
    "spreadsheet formulas", "keyboard shortcuts", "backups", "phishing", "two-factor authentication",
    "Wi-Fi", "GPS", "electric grids", "dams", "tunnels", "highways", "ports", "container ships",
)
CHAT_FORMS: tuple[str, ...] = (
    "Explain {t} in simple terms.",
    "What are three interesting facts about {t}?",
    "Write a short paragraph about {t} for a ten-year-old.",
    "Can you summarize the main ideas of {t}?",
    "Give me a list of five tips related to {t}.",
    "What is the history of {t}?",
    "Why is {t} important?",
    "Write a haiku about {t}.",
    "What are common misconceptions about {t}?",
    "Compare {t} with something from everyday life.",
    "How does {t} work?",
    "Tell me about {t}.",
    "What should a beginner know about {t}?",
    "What are the pros and cons of {t}?",
    "Describe {t} in one paragraph.",
    "Write a short story that involves {t}.",
    # Added 2026-12-02 for the fourth training round: requests shaped like advice and planning.
    "I am curious about {t}. Where should I start?",
    "Give me some practical advice about {t}.",
    "Write a short friendly email to a colleague about {t}.",
    "What questions would a student ask about {t}, and what are the answers?",
    "Suggest three small projects that involve {t}.",
    "Explain {t} to someone who has never heard of it, in a few sentences.",
)

CODE_TASKS: tuple[str, ...] = (
    "reverses a string", "checks whether a number is prime", "computes the nth Fibonacci number",
    "counts the words in a text", "removes duplicates from a list while keeping order", "merges two sorted lists",
    "finds the largest element in a list", "flattens a nested list", "checks whether a string is a palindrome",
    "converts Celsius to Fahrenheit", "reads a CSV file and returns the rows as dictionaries",
    "computes the factorial of a number", "sorts a list of dictionaries by a key", "parses a date string",
    "validates an email address with a regular expression", "computes the average of a list of numbers",
    "implements binary search", "implements a stack class", "implements a queue with two stacks",
    "counts character frequencies in a string", "transposes a matrix", "generates all permutations of a list",
    "finds the greatest common divisor of two numbers", "converts a decimal number to binary",
    "reads a JSON file and prints its keys", "retries a function call with exponential backoff",
    "implements an LRU cache", "chunks a list into pieces of size n", "checks whether two strings are anagrams",
    "computes the dot product of two vectors", "finds the most common element in a list",
    "walks a directory and lists all .txt files", "implements bubble sort", "implements quicksort",
    "implements a linked list", "capitalizes every word in a sentence", "computes a running sum",
    "downloads a web page with urllib", "parses command line arguments with argparse",
    "writes a list of dictionaries to a CSV file", "measures how long a function takes",
    "implements a simple tokenizer", "checks balanced parentheses", "rotates a list by k positions",
    "computes the median of a list", "converts a Roman numeral to an integer", "implements a binary tree",
    "computes the Levenshtein distance", "groups words by their first letter", "implements a decorator that logs calls",
    # Added 2026-12-02 for the third training round.
    "checks whether a year is a leap year", "counts the vowels in a string", "finds the second largest number in a list",
    "converts a string to title case without str.title", "computes the sum of the digits of an integer",
    "splits a full name into first and last name", "formats a number of seconds as hours, minutes and seconds",
    "generates a random password", "checks whether a list is sorted", "finds all pairs in a list that sum to a target",
    "computes the intersection of two lists", "implements a min heap", "implements depth-first search on a graph",
    "implements breadth-first search on a graph", "computes the area of a circle", "converts a dictionary to a JSON string",
    "reads a text file and counts its lines", "replaces every tab in a file with four spaces",
    "computes the cumulative product of a list", "finds the longest word in a sentence", "zips two lists into a dictionary",
    "implements a counter class with increment and reset", "computes compound interest", "simulates rolling two dice",
    "parses a URL into its parts", "computes the mode of a list", "implements insertion sort", "implements merge sort",
    "removes punctuation from a string", "checks whether a string contains only digits",
    "computes the power set of a set", "finds the missing number in a sequence", "implements a trie",
    "groups a list of tuples by their first element", "converts snake_case to camelCase",
    "memoizes a recursive function", "implements a context manager that times a block",
    "writes a generator that yields prime numbers", "validates a phone number format",
    "computes the transpose of a list of lists with zip", "implements a simple bank account class",
    "finds duplicate files by their hash", "sends a GET request and parses the JSON response",
    "implements a dataclass for a 2D point with a distance method", "computes Pascal's triangle",
)
CODE_FORMS: tuple[str, ...] = (
    "Write a Python function that {t}.",
    "Write a Python function that {t}. Include a docstring and an example.",
    "How do I write Python code that {t}?",
    "Show me a short Python program that {t}, with comments.",
    "Write a Python class or function that {t}, and explain how it works.",
)

# Tools in the OpenAI function format; arguments are filled per scenario.
TOOLS: dict[str, dict[str, Any]] = {
    "get_weather": {"description": "Get the current weather for a city.",
                    "parameters": {"type": "object", "properties": {
                        "city": {"type": "string", "description": "City name"},
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}},
    "search_web": {"description": "Search the web and return the top results.",
                   "parameters": {"type": "object", "properties": {
                       "query": {"type": "string"}, "num_results": {"type": "integer"}}, "required": ["query"]}},
    "read_file": {"description": "Read a text file from the repository.",
                  "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    "list_directory": {"description": "List the files in a directory of the repository.",
                       "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                      "required": ["path"]}},
    "grep": {"description": "Search files for a regular expression.",
             "parameters": {"type": "object", "properties": {
                 "pattern": {"type": "string"}, "path": {"type": "string"}}, "required": ["pattern"]}},
    "run_python": {"description": "Run a Python snippet and return its output.",
                   "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}},
    "calculator": {"description": "Evaluate an arithmetic expression.",
                   "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                  "required": ["expression"]}},
    "send_email": {"description": "Send an email.",
                   "parameters": {"type": "object", "properties": {
                       "to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}},
                       "required": ["to", "subject", "body"]}},
    "get_stock_price": {"description": "Get the latest price of a stock.",
                        "parameters": {"type": "object", "properties": {"symbol": {"type": "string"}},
                                       "required": ["symbol"]}},
    "create_event": {"description": "Create a calendar event.",
                     "parameters": {"type": "object", "properties": {
                         "title": {"type": "string"}, "date": {"type": "string"}, "time": {"type": "string"}},
                         "required": ["title", "date"]}},
}

# (tool, user request with {x}, the values {x} takes). The value is the split key.
TOOL_TASKS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("get_weather", "What's the weather like in {x} right now?",
     ("Paris", "Tokyo", "Nairobi", "Lima", "Oslo", "Toronto", "Sydney", "Cairo", "Berlin", "Mumbai", "Seoul", "Denver")),
    ("search_web", "Search the web for {x} and tell me what you find.",
     ("the latest Python release", "best hiking trails in Utah", "how to fix a leaky faucet", "history of the bicycle",
      "vegan lasagna recipes", "reviews of noise cancelling headphones", "the tallest building in the world",
      "how to learn Rust", "cheap flights to Lisbon", "symptoms of dehydration")),
    ("read_file", "Open {x} and explain what the code does.", ()),
    ("list_directory", "What files are in the {x} directory?", ()),
    ("grep", "Find where {x} is defined in the code base.",
     ("parse_args", "class Request", "def main", "TIMEOUT", "def connect", "import json", "class Config",
      "def validate", "logger =", "def close")),
    ("run_python", "Run this Python code and tell me the output: {x}",
     ("print(sum(range(10)))", "print('hello'.upper())", "print(sorted([3, 1, 2]))", "print(2 ** 16)",
      "print(len('draftgate'))", "import math; print(math.pi)", "print([i * i for i in range(5)])",
      "print({'a': 1}.get('b', 0))")),
    ("calculator", "What is {x}?",
     ("17 * 23", "1024 / 8", "3.5 * 4 + 2", "(12 + 8) * 3", "999 - 123", "2 ** 10", "45 % 7", "81 / 9 + 6")),
    ("send_email", "Send an email to {x} telling them the meeting moved to Friday.",
     ("alice@example.com", "bob@example.org", "team@example.com", "carol@example.net", "dan@example.com")),
    ("get_stock_price", "What's the current price of {x} stock?",
     ("AAPL", "MSFT", "GOOG", "AMZN", "NVDA", "TSLA", "IBM", "ORCL")),
    ("create_event", "Put {x} on my calendar for next Tuesday at 3pm.",
     ("a dentist appointment", "lunch with Sam", "the quarterly review", "a yoga class", "a call with the bank")),
)


@dataclass(frozen=True)
class PromptItem:
    kind: str  # "chat", "code" or "tool"
    key: str  # what the split is decided on
    text: str  # the user message (chat, code) or request (tool)
    tool: str | None = None  # tool scenarios: the tool the request needs
    argument: str | None = None  # tool scenarios: the value in the request


def chat_prompts(*, held_out: bool, held_out_percent: float) -> list[PromptItem]:
    return [PromptItem("chat", topic, form.format(t=topic))
            for topic in CHAT_TOPICS if is_held_out("chat:" + topic, held_out_percent) == held_out
            for form in CHAT_FORMS]


def code_task_prompts(*, held_out: bool, held_out_percent: float) -> list[PromptItem]:
    return [PromptItem("code", task, form.format(t=task))
            for task in CODE_TASKS if is_held_out("code:" + task, held_out_percent) == held_out
            for form in CODE_FORMS]


def tool_prompts(*, held_out: bool, held_out_percent: float, file_paths: list[str],
                 dir_paths: list[str]) -> list[PromptItem]:
    """file_paths / dir_paths: stdlib paths (of the same split) for read_file / list_directory."""
    items: list[PromptItem] = []
    for tool, request, values in TOOL_TASKS:
        if tool == "read_file":
            values = tuple(file_paths)
        elif tool == "list_directory":
            values = tuple(dir_paths)
        for value in values:
            if tool in ("read_file", "list_directory") or is_held_out(f"tool:{tool}:{value}", held_out_percent) == held_out:
                items.append(PromptItem("tool", f"{tool}:{value}", request.format(x=value), tool, value))
    return items


def tool_subset(rng: random.Random, needed: str, max_tools: int = 4) -> list[dict[str, Any]]:
    """The tools offered in one scenario: the needed one and a few others, shuffled, in the
    OpenAI request format."""
    others = [name for name in TOOLS if name != needed]
    names = [needed] + rng.sample(others, rng.randint(1, max_tools - 1))
    rng.shuffle(names)
    return [{"type": "function", "function": {"name": name, **TOOLS[name]}} for name in names]


def sample_items(items: list[PromptItem], count: int, rng: random.Random) -> list[PromptItem]:
    """count items: a shuffled pass over all of them, repeated when count is larger."""
    if not items or count <= 0:
        return []
    chosen: list[PromptItem] = []
    while len(chosen) < count:
        batch = list(items)
        rng.shuffle(batch)
        chosen.extend(batch[: count - len(chosen)])
    return chosen
