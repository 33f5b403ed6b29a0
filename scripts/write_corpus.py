#!/usr/bin/env python3
"""Write datasets/sonnets.txt: the project's own sonnet-style corpus.

The verse is composed here from the project's own word lists and line
templates with a fixed seed, so the corpus is original, reproducible and free
of anyone else's text. The format follows the file that vLLM's sonnet
benchmark reads: plain text, one poem line per line, no blank lines, sonnets
of 14 lines rhymed ABAB CDCD EFEF GG, lines of roughly 8 to 12 words.

    python scripts/write_corpus.py            # rewrite datasets/sonnets.txt
    python scripts/write_corpus.py --stdout   # print instead

Only ``random.Random(seed)`` drives the choices (its integer-seeded ``choice``
and ``sample`` are stable across CPython 3 releases), so the output is
byte-identical on every machine.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from pathlib import Path

SEED = 1729
NUM_SONNETS = 38  # 38 x 14 = 532 lines, about 25 KB
OUT = Path(__file__).resolve().parent.parent / "datasets" / "sonnets.txt"

# Rhyme families of singular nouns, so every template can end on "the <adj> <R>".
RHYMES: list[list[str]] = [
    ["light", "night", "sight", "flight", "height", "kite", "rite", "blight", "delight"],
    ["day", "way", "clay", "bay", "spray", "ray", "hay", "decay", "array", "display"],
    ["sea", "tree", "key", "plea", "bee", "lee", "decree", "reverie"],
    ["rain", "lane", "grain", "plain", "chain", "vane", "pane", "refrain", "domain"],
    ["stone", "bone", "throne", "tone", "zone", "drone", "cone", "unknown"],
    ["song", "throng", "gong", "prong", "oblong"],
    ["fire", "wire", "choir", "spire", "lyre", "pyre", "desire", "attire", "briar"],
    ["heart", "art", "part", "chart", "cart", "start", "dart", "counterpart"],
    ["hour", "flower", "tower", "power", "shower", "bower", "sunflower"],
    ["gold", "fold", "cold", "mould", "hold", "wold", "marigold", "threshold"],
    ["shore", "door", "floor", "oar", "lore", "core", "store", "ore", "roar"],
    ["moon", "noon", "tune", "dune", "rune", "lagoon", "spoon", "afternoon"],
    ["sky", "eye", "cry", "sigh", "lullaby", "dye", "butterfly", "reply"],
    ["name", "flame", "frame", "game", "claim", "fame", "shame"],
    ["dream", "stream", "seam", "beam", "gleam", "theme", "steam"],
    ["breath", "death", "heath", "shibboleth"],
    ["field", "shield", "yield", "weald"],
    ["rose", "prose", "repose", "close", "throes"],
    ["grace", "face", "place", "space", "lace", "pace", "vase", "embrace", "trace"],
    ["sound", "ground", "mound", "hound", "round", "compound"],
    ["wall", "hall", "fall", "call", "shawl", "squall", "stall", "thrall"],
    ["tide", "side", "bride", "guide", "pride", "stride", "hillside", "riverside"],
    ["year", "tear", "sphere", "frontier", "pier", "spear", "chandelier"],
    ["wing", "spring", "string", "ring", "king", "offering", "sling"],
    ["thread", "bread", "bed", "head", "shed", "homestead", "watershed"],
    ["ash", "flash", "sash", "splash", "calabash"],
    ["hill", "mill", "sill", "rill", "will", "daffodil", "windowsill"],
    ["air", "prayer", "stair", "chair", "snare", "affair", "square"],
]

ADJ = [
    "amber",
    "ancient",
    "ashen",
    "autumn",
    "bitter",
    "blessed",
    "bright",
    "broken",
    "candid",
    "careless",
    "cloudy",
    "crimson",
    "distant",
    "dusky",
    "early",
    "emerald",
    "empty",
    "faithful",
    "fallen",
    "fervent",
    "fickle",
    "gentle",
    "gilded",
    "golden",
    "hallowed",
    "hidden",
    "hollow",
    "honest",
    "idle",
    "ivory",
    "jealous",
    "lonely",
    "mellow",
    "merry",
    "mortal",
    "narrow",
    "patient",
    "pale",
    "quiet",
    "ragged",
    "restless",
    "russet",
    "sable",
    "secret",
    "silent",
    "silver",
    "slender",
    "sober",
    "solemn",
    "stubborn",
    "sullen",
    "summer",
    "tender",
    "timid",
    "trembling",
    "velvet",
    "wandering",
    "wakeful",
    "weary",
    "wild",
    "winter",
    "wistful",
    "youthful",
    "open",
]

NOUN = [
    "April",
    "anchor",
    "answer",
    "arrow",
    "autumn",
    "banner",
    "blossom",
    "bracelet",
    "candle",
    "castle",
    "cellar",
    "cinder",
    "clover",
    "comet",
    "compass",
    "cottage",
    "courage",
    "cradle",
    "ember",
    "fable",
    "feather",
    "fiddle",
    "forest",
    "fountain",
    "garden",
    "garland",
    "harbour",
    "harvest",
    "heron",
    "hunger",
    "island",
    "ivy",
    "journey",
    "ladder",
    "lantern",
    "letter",
    "meadow",
    "memory",
    "mirror",
    "morning",
    "orchard",
    "pebble",
    "pilgrim",
    "promise",
    "quarrel",
    "raven",
    "ribbon",
    "river",
    "shadow",
    "shepherd",
    "silence",
    "sorrow",
    "sparrow",
    "summer",
    "thistle",
    "timber",
    "valley",
    "velvet",
    "violet",
    "voyage",
    "willow",
    "window",
    "winter",
    "whisper",
]

PLURAL = [
    "ashes",
    "bells",
    "birds",
    "brambles",
    "candles",
    "clouds",
    "embers",
    "fields",
    "flowers",
    "ghosts",
    "hands",
    "heavens",
    "hours",
    "islands",
    "kings",
    "lanterns",
    "leaves",
    "lovers",
    "maidens",
    "meadows",
    "minutes",
    "orchards",
    "petals",
    "pilgrims",
    "poets",
    "rivers",
    "roses",
    "sailors",
    "seasons",
    "shadows",
    "sparrows",
    "stars",
    "storms",
    "swallows",
    "thorns",
    "voices",
    "waters",
    "willows",
    "winds",
    "years",
]

# Verbs as (third person singular, base form, past participle).
VERB = [
    ("wanders", "wander", "wandered"),
    ("lingers", "linger", "lingered"),
    ("trembles", "tremble", "trembled"),
    ("whispers", "whisper", "whispered"),
    ("gathers", "gather", "gathered"),
    ("kindles", "kindle", "kindled"),
    ("borrows", "borrow", "borrowed"),
    ("answers", "answer", "answered"),
    ("remembers", "remember", "remembered"),
    ("carries", "carry", "carried"),
    ("follows", "follow", "followed"),
    ("shelters", "shelter", "sheltered"),
    ("measures", "measure", "measured"),
    ("scatters", "scatter", "scattered"),
    ("mends", "mend", "mended"),
    ("sings", "sing", "sung"),
    ("weeps", "weep", "wept"),
    ("keeps", "keep", "kept"),
    ("breaks", "break", "broken"),
    ("hides", "hide", "hidden"),
    ("falls", "fall", "fallen"),
    ("turns", "turn", "turned"),
    ("dwells", "dwell", "dwelt"),
    ("sleeps", "sleep", "slept"),
    ("burns", "burn", "burned"),
    ("fades", "fade", "faded"),
    ("waits", "wait", "waited"),
    ("climbs", "climb", "climbed"),
    ("calls", "call", "called"),
    ("wakes", "wake", "woken"),
    ("drifts", "drift", "drifted"),
    ("glimmers", "glimmer", "glimmered"),
]

PREP = [
    "across",
    "along",
    "among",
    "above",
    "beneath",
    "beside",
    "beyond",
    "through",
    "toward",
    "upon",
    "within",
    "without",
    "behind",
    "before",
    "under",
    "over",
]

ADV = [
    "softly",
    "slowly",
    "gladly",
    "sadly",
    "lightly",
    "quietly",
    "gently",
    "always",
    "never",
    "often",
    "still",
    "truly",
    "boldly",
    "sweetly",
    "barely",
    "nightly",
]

POSS = ["my", "thy", "your", "our", "his", "her", "their"]

# Line templates. {R} is the rhyme word; the tuple's second field is the line's
# natural end punctuation when it is not the last line of a quatrain.
TEMPLATES: list[str] = [
    "When {a} {n} {v} {p} the {a2} {R}",
    "And the {n} {v} {adv} {p} {poss} {a} {R}",
    "Yet I have {vpp} the {a} {n} of {poss} {R}",
    "So let the {a} {ns} {vb} {p} the {R}",
    "Thy {n} is {a} as any {a2} {R}",
    "No {a} {n} can {vb} the {a2} {R}",
    "How {a} the {n} that {v} beneath the {R}",
    "Then {vb} with me {p} the {a} {R}",
    "For every {n} that {v} {p} the {a} {R}",
    "O {a} {n}, {vb} not the {a2} {R}",
    "I {vb} thy {n} as {ns} {vb2} the {R}",
    "Though {ns} {vb} {adv} {p} the {a} {R}",
    "Within the {n} of some {a} {R}",
    "While {ns} of {n} {vb} {p} a {a} {R}",
    "Who {v} {adv} when the {a} {ns} {vb2} {p} the {R}",
    "And all the {a} {ns} {vb} {p} {poss} {R}",
    "But {poss} {n} {v} where once I {vb2} the {R}",
    "Since the {a} {n} has {vpp} the {a2} {R}",
    "Let no {a} {n} {vb} {adv} from the {R}",
    "If {ns} {vb} {p} the {n} and the {R}",
    "My {n}, my {a} {n2}, my {a2} {R}",
    "Go, {a} {n}, and {vb} {p} the {R}",
    "Nor shall the {a} {n} {vb} {p} {poss} {R}",
    "As {a} {ns} {vb} {adv} {p} a {a2} {R}",
    "There {v} a {a} {n} {p} the {a2} {R}",
    "The {n} {v}, the {ns} {vb2} {p} the {R}",
    "Until the {a} {n} {v} {p} the {a2} {R}",
    "Lo, how the {n} {v} {adv} {p} the {R}",
    "What {a} {n} {v} {p} {poss} {a2} {R}",
    "Once more the {n} {v} {p} the {a} {R}",
    "And though the {a} {ns} {vb} {adv} {p} the {a2} {R}",
    "When all the {ns} of {n} have {vpp} {p} the {R}",
    "I watched the {a} {n} {vb} {adv} {p} the {a2} {R}",
    "Yet still the {n} {v} and the {ns} {vb2} {p} the {R}",
    "How often have the {a} {ns} {vpp} {p} {poss} {a2} {R}",
    "Because the {a} {n} {v} {adv}, I {vb2} {p} the {R}",
    "And every {a} {n} that {v} {p} the {a2} {R}",
]

# Closing couplets lean on a few turns of their own.
COUPLET_TEMPLATES: list[str] = [
    "So long as {ns} {vb} {p} the {a} {R}",
    "So {v} the {n}, and so {v2} the {R}",
    "And this {a} {n} shall {vb} thee like a {R}",
    "Till {ns} {vb} {adv} and {ns2} forget the {R}",
    "Thus {poss} {a} {n} outlives the {a2} {R}",
    "Then keep this {n} {p} {poss} {a} {R}",
]

SCHEME = "ABABCDCDEFEFGG"


def _article_fix(line: str) -> str:
    # "a amber" -> "an amber"; keeps the templates simple.
    return re.sub(r"\b([Aa]) (?=[aeiouAEIOU])", r"\1n ", line)


def _fill(rng: random.Random, template: str, rhyme: str) -> str:
    """Fill one template, drawing distinct words where a slot repeats."""
    adjs = rng.sample(ADJ, 2)
    nouns = rng.sample(NOUN, 2)
    plurals = rng.sample(PLURAL, 2)
    verbs = rng.sample(VERB, 2)
    words = {
        "a": adjs[0],
        "a2": adjs[1],
        "n": nouns[0],
        "n2": nouns[1],
        "ns": plurals[0],
        "ns2": plurals[1],
        "v": verbs[0][0],
        "v2": verbs[1][0],
        "vb": verbs[0][1],
        "vb2": verbs[1][1],
        "vpp": verbs[0][2],
        "p": rng.choice(PREP),
        "adv": rng.choice(ADV),
        "poss": rng.choice(POSS),
        "R": rhyme,
    }
    line = template.format(**words)
    return _article_fix(line[0].upper() + line[1:])


def _punctuate(line: str, index: int, rng: random.Random) -> str:
    if index == 13:
        return line + "."
    if index in (3, 7, 11):
        return line + rng.choice([".", ";", ":", "."])
    if line.startswith(("How ", "What ", "Lo, ")) and index % 2 == 1:
        return line + "!"
    return line + rng.choice([",", ",", ",", "", ";"])


def sonnet(rng: random.Random) -> list[str]:
    families = rng.sample(RHYMES, len(set(SCHEME)))
    ends = {letter: rng.sample(fam, 2) for letter, fam in zip(sorted(set(SCHEME)), families)}
    used: dict[str, int] = {letter: 0 for letter in ends}
    templates = rng.sample(TEMPLATES, 12)
    lines = []
    for i, letter in enumerate(SCHEME):
        rhyme = ends[letter][used[letter]]
        used[letter] += 1
        template = templates[i] if i < 12 else rng.choice(COUPLET_TEMPLATES)
        lines.append(_punctuate(_fill(rng, template, rhyme), i, rng))
    return lines


def corpus(seed: int = SEED, count: int = NUM_SONNETS) -> str:
    rng = random.Random(seed)
    lines = [line for _ in range(count) for line in sonnet(rng)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stdout", action="store_true", help="print instead of writing the file")
    parser.add_argument("--out", type=Path, default=OUT, help="where to write (default: %(default)s)")
    args = parser.parse_args(argv)
    text = corpus()
    if args.stdout:
        sys.stdout.write(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
