"""python_alloc.py - allocation-heavy CPython: the WebUI's own Python code
(request handling, JSON APIs, prompt and metadata strings, settings dicts).

Each round serialises and parses a nested document with json, builds strings
piece by piece, and churns a dict whose values are replaced at random.  The
runner runs it with CPython's small-object allocator (pymalloc, the default)
and with PYTHONMALLOC=malloc, where every object goes to malloc.

usage: python_alloc.py ROUNDS
Prints one JSON object: ops (rounds), ops_per_s, checksum.
"""

import json
import random
import sys
import time

SEED = 20240917
DOC_USERS = 200  # records in the JSON document
DOC_TAGS = 8  # list items per record
STRING_PIECES = 2000  # fragments joined per round
DICT_KEYS = 5000  # live keys in the churned dict
DICT_REPLACEMENTS = 20000  # random replacements per round


def make_document(rng):
    return {
        "users": [
            {
                "id": i,
                "name": f"user-{i}-{rng.randrange(1 << 30):x}",
                "score": rng.random(),
                "tags": [f"tag{rng.randrange(100)}" for _ in range(DOC_TAGS)],
                "meta": {"steps": rng.randrange(10, 150), "cfg": rng.uniform(1, 15), "ok": True},
            }
            for i in range(DOC_USERS)
        ]
    }


def one_round(rng, doc, table):
    text = json.dumps(doc)
    parsed = json.loads(text)
    pieces = [f"{rng.randrange(1000)}:{parsed['users'][k % DOC_USERS]['name']}" for k in range(STRING_PIECES)]
    prompt = ", ".join(pieces)
    for _ in range(DICT_REPLACEMENTS):
        key = rng.randrange(DICT_KEYS)
        table[key] = [key, str(key) * rng.randrange(1, 8), (key, rng.random())]
    return len(text) + len(prompt) + len(table)


def main():
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        sys.exit(f"usage: {sys.argv[0]} ROUNDS")
    rounds = int(sys.argv[1])
    rng = random.Random(SEED)
    doc = make_document(rng)
    table = {}
    checksum = 0
    start = time.monotonic()
    for _ in range(rounds):
        checksum += one_round(rng, doc, table)
    secs = time.monotonic() - start
    print(json.dumps({"ops": rounds, "ops_per_s": round(rounds / secs, 2), "checksum": checksum}))


if __name__ == "__main__":
    main()
