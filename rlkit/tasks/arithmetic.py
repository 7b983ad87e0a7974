"""Procedural GSM8K-style word problems for the tiny engine, with plain and calculator-tool solutions.

A problem is a short story about one running quantity from one of ten templates, each computation one solution
step (at most :data:`MAX_OPS`), every value a whole number from 1 to ``max_value``, division exact. Solutions: plain
``48-18=30. 30/2=15. #### 15``, tool ``<code>48-18</code><output>30</output>… #### 15`` (outputs written by the
environment) and mixed; the reward is rlkit's one answer rule (:func:`rlkit.tasks.gsm8k.score`). A hash of the
normalised question puts it in ``test`` (:data:`TEST_FRACTION`) or ``train`` for good; :func:`make_pool` is a fixed
list of training problems for methods whose prompts come back (SPO). Every text uses only :data:`ALPHABET`.
"""

from __future__ import annotations

import hashlib
import random
import string
from collections.abc import Iterator
from dataclasses import dataclass, fields

from rlkit.tasks.calculator import run_tool
from rlkit.tasks.gsm8k import score
from rlkit.tasks.protocol import tool_call

ALPHABET = "\n !#$%'()*+,-./0123456789:<=>?" + string.ascii_uppercase + string.ascii_lowercase
"""Every character a question, prompt, solution or calculator output may contain (82 characters)."""
SEPARATOR = "\n"
"""What :func:`prompt` puts after the question."""
FORMS = ("tool", "plain", "mixed")
MIXED_TOOL_SHARE = 0.3
"""In the mixed form, the share of steps written as calculator calls: at ½ a greedy SFT model's choice was a coin
flip its weights' last bits decided (accuracy 8.5–27.8% by seed or CPU, reproductions/LOG.md)."""
PLAN_SHARE = 0.5
"""In the mixed form, the share of solutions that open with a plan in words (``Plan: subtract, divide.``)."""
_OP_WORDS = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide"}
SPLITS = ("train", "test")
TEST_FRACTION = 0.1
"""Share of question space (by hash) that belongs to the held-out split."""
MAX_OPS = 4
MAX_QUESTION_CHARS = 200
"""Longest question (without the separator), whatever the knobs: longer draws are redrawn."""


@dataclass(frozen=True)
class TaskConfig:
    """Difficulty knobs of the generator (the ``**knobs`` of :func:`make_split` and :func:`make_pool`)."""

    min_ops: int = 1  # Fewest operations (solution steps) per problem.
    max_ops: int = 3  # Most operations per problem, at most 4.
    max_number: int = 99  # Largest number written in a question (multipliers and divisors: 2–9, at most this).
    max_value: int = 999  # Largest intermediate value and answer (ages problems: at most 99).
    templates: tuple[str, ...] | None = None  # Template names to draw from (see ``TEMPLATES``); None means all.

    def __post_init__(self) -> None:
        if not 1 <= self.min_ops <= self.max_ops <= MAX_OPS:
            raise ValueError(f"need 1 <= min_ops <= max_ops <= {MAX_OPS}, got {self.min_ops}, {self.max_ops}")
        if self.max_number < 2:
            raise ValueError(f"max_number must be at least 2 (multipliers start at 2), got {self.max_number}")
        if self.max_value < max(10, self.max_number):
            raise ValueError(f"max_value must be at least max(10, max_number), got {self.max_value}")
        if self.templates is not None:
            unknown = sorted(set(self.templates) - set(TEMPLATES))
            if unknown or not self.templates:
                raise ValueError(f"unknown templates {unknown or '(empty)'}; valid: {', '.join(TEMPLATES)}")
            object.__setattr__(self, "templates", tuple(self.templates))

    def max_solution_chars(self, form: str = "tool") -> int:
        """An upper bound on a solution's length in ``form`` (a step: expression, value, tags; a plan: 10 a step)."""
        if form not in FORMS:
            raise ValueError(f"unknown solution form {form!r}; valid: {', '.join(FORMS)}")
        dv, dn = len(str(self.max_value)), len(str(self.max_number))
        per_step = (3 if form == "plain" else 30) + 2 * dv + 1 + dn  # plain: "=", "." and the joining space
        plan = len("Plan: ") + 10 * self.max_ops + 1 if form == "mixed" else 0  # words, separators, the space
        return plan + self.max_ops * per_step + len(" #### ") + dv


@dataclass(frozen=True)
class Problem:
    """One word problem: its question, integer answer and solution steps ``(expression, value)``."""

    question: str
    answer: int
    steps: tuple[tuple[str, int], ...]
    template: str

    @property
    def n_ops(self) -> int:
        return len(self.steps)

    @property
    def plain(self) -> str:
        """``48-18=30. 30/2=15. #### 15``: the model does the arithmetic."""
        return " ".join(f"{expr}={value}." for expr, value in self.steps) + f" #### {self.answer}"

    @property
    def tool(self) -> str:
        """``<code>48-18</code><output>30</output>… #### 15``: outputs are the calculator's answers."""
        calls = "".join(tool_call(expr, run_tool(expr)) for expr, _ in self.steps)
        return f"{calls} #### {self.answer}"

    @property
    def plan(self) -> str:
        """``Plan: subtract, divide.``: the operations in words, in order (text before the first step)."""
        ops = [next(c for c in expr[1:] if c in _OP_WORDS) for expr, _ in self.steps]  # expr[0] is a digit
        return "Plan: " + ", ".join(_OP_WORDS[op] for op in ops) + "."

    @property
    def mixed(self) -> str:
        """``Plan: subtract, divide. 48-18=30. <code>30/2</code><output>15</output> #### 15``: each step is a
        calculator call or plain arithmetic, chosen per step with probability :data:`MIXED_TOOL_SHARE`, and with
        probability :data:`PLAN_SHARE` the solution first states its plan in words — both drawn by generators
        seeded with the question, so a problem always has the same solution.

        This is tool-integrated reasoning in miniature. A plain step the tiny model computes itself is often
        wrong, so RL gains by calling the calculator (the TIR capability claim). The plan changes no answer but
        moves the first call ~25 tokens later, so correct responses to one prompt differ in where their first call
        comes — what ASPO's Eq. 2 shapes and GRPO ignores."""
        q = normalize_question(self.question)
        rng = random.Random(f"mixed:{q}")
        parts = [f"{self.plan} "] if random.Random(f"plan:{q}").random() < PLAN_SHARE else []
        for expr, value in self.steps:
            plain = rng.random() >= MIXED_TOOL_SHARE
            parts.append(f"{expr}={value}. " if plain else tool_call(expr, run_tool(expr)))
        return "".join(parts).rstrip() + f" #### {self.answer}"

    def solution(self, form: str = "tool") -> str:
        """The gold response in ``form``: ``"tool"``, ``"plain"`` or ``"mixed"``."""
        if form not in FORMS:
            raise ValueError(f"unknown solution form {form!r}; valid: {', '.join(FORMS)}")
        return getattr(self, form)


# ---------------------------------------------------------------------------------------------- templates
# An event's text may use {N} (the main name), {P}/{p} (its pronoun), {M} (a new person), {prev} (the last
# person named), {item}/{items}, {a} (an amount) and {k} (a multiplier or divisor, 2–9).
@dataclass(frozen=True)
class _Event:
    kind: str
    """start | add | sub | mul | div | add_group (v + k·a) | sub_group (v − k·a); a start with group=True
    is the product k·a."""
    text: str
    question: str | None = None  # Set for an event that can only come last: it asks its own question.
    ks: tuple[int, ...] = tuple(range(2, 10))
    rate: bool = False  # A product written ``a*k`` (a per hour for k hours) rather than ``k*a`` (k bags of a).
    group: bool = False  # A start that is already a product (one step).
    new_person: bool = False

    @property
    def n_steps(self) -> int:
        return {"start": int(self.group), "add_group": 2, "sub_group": 2}.get(self.kind, 1)


@dataclass(frozen=True)
class _Template:
    name: str
    start: _Event
    events: tuple[_Event, ...]
    question: str
    items: tuple[tuple[str, str], ...] = (("", ""),)
    cap: int | None = None
    names: int = 1  # how many distinct people the template may name


_GOODS = (("pen", "pens"), ("book", "books"), ("toy", "toys"), ("hat", "hats"), ("kite", "kites"),
          ("cap", "caps"), ("game", "games"), ("ball", "balls"))


_ev = _Event


_TEMPLATES = (
    _Template("shopping", _ev("start", "{N} has ${a}."), (
        _ev("add", "{P} earns ${a}."),
        _ev("sub", "{P} spends ${a} on a {item}."),
        _ev("sub_group", "{P} buys {k} {items} for ${a} each."),
        _ev("add_group", "{P} sells {k} {items} for ${a} each."),
        _ev("div", "{P} splits it equally among {k} kids.", question="How many dollars does each kid get?"),
    ), "How much does {N} have now?", _GOODS),
    _Template("sharing", _ev("start", "{N} has {a} {items}."), (
        _ev("add", "{P} finds {a} more."),
        _ev("sub", "{P} loses {a}."),
        _ev("add_group", "{P} gets {k} bags of {a}."),
        _ev("sub_group", "{P} gives {k} friends {a} each."),
        _ev("mul", "Then {p} has {k} times as many.", ks=(2, 3, 4, 5)),
        _ev("div", "{P} shares them equally among {k} friends.", question="How many does each friend get?"),
    ), "How many does {N} have now?",
        (("candy", "candies"), ("sticker", "stickers"), ("marble", "marbles"), ("card", "cards"),
         ("shell", "shells"), ("bead", "beads"))),
    _Template("rates", _ev("start", "A {item} goes {a} km an hour for {k} hours.", group=True, rate=True), (
        _ev("add", "Then it goes {a} km more."),
        _ev("sub", "Then it goes back {a} km."),
        _ev("add_group", "Then it goes {a} km an hour for {k} more hours.", rate=True),
    ), "How many km is it from the start?",
        (("car", "cars"), ("bus", "buses"), ("train", "trains"), ("boat", "boats"), ("bike", "bikes"))),
    _Template("ages", _ev("start", "{N} is {a} years old."), (
        _ev("add", "{M} is {a} years older than {prev}.", new_person=True),
        _ev("sub", "{M} is {a} years younger than {prev}.", new_person=True),
        _ev("mul", "{M} is {k} times as old as {prev}.", ks=(2, 3, 4), new_person=True),
        _ev("div", "{M} is half as old as {prev}.", ks=(2,), new_person=True),
        _ev("add", "", question="How old will {prev} be in {a} years?"),
    ), "How old is {prev}?", cap=99, names=MAX_OPS + 1),
    _Template("savings", _ev("start", "{N} saves ${a} a week for {k} weeks.", group=True, rate=True), (
        _ev("add", "{P} gets ${a} as a gift."),
        _ev("sub", "{P} spends ${a} on a {item}."),
        _ev("sub_group", "{P} buys {k} {items} for ${a} each."),
        _ev("div", "{P} puts it equally into {k} jars.", question="How many dollars go in each jar?"),
    ), "How much does {N} have now?", _GOODS),
    _Template("baking", _ev("start", "{N} bakes {k} trays of {a} {items}.", group=True), (
        _ev("add", "{P} bakes {a} more."),
        _ev("sub", "{P} eats {a}."),
        _ev("add_group", "{P} buys {k} packs of {a}."),
        _ev("sub_group", "{P} gives {k} neighbors {a} each."),
        _ev("div", "{P} packs them equally into {k} boxes.", question="How many {items} go in each box?"),
    ), "How many {items} does {N} have now?",
        (("cookie", "cookies"), ("muffin", "muffins"), ("bun", "buns"), ("roll", "rolls"), ("tart", "tarts"))),
    _Template("garden", _ev("start", "{N}'s tree has {a} {items}."), (
        _ev("add", "Then {a} more grow."),
        _ev("sub", "{P} picks {a}."),
        _ev("sub_group", "{k} birds eat {a} each."),
        _ev("div", "{N} picks them all and fills bags of {k}.", question="How many bags does {N} fill?"),
    ), "How many are on the tree now?",
        (("apple", "apples"), ("pear", "pears"), ("plum", "plums"), ("lemon", "lemons"), ("fig", "figs"))),
    _Template("bus", _ev("start", "A {item} has {a} people."), (
        _ev("add", "At a stop, {a} get on."),
        _ev("sub", "At a stop, {a} get off."),
        _ev("add_group", "{k} groups of {a} get on."),
        _ev("sub_group", "{k} groups of {a} get off."),
        _ev("div", "They sit equally in {k} rows.", question="How many sit in each row?"),
    ), "How many people are on it now?",
        (("bus", "buses"), ("train", "trains"), ("tram", "trams"), ("ferry", "ferries"))),
    _Template("library", _ev("start", "A library has {k} shelves of {a} {items}.", group=True), (
        _ev("add", "It gets {a} new {items}."),
        _ev("sub", "It lends out {a} {items}."),
        _ev("add_group", "It gets {k} boxes of {a} {items}."),
        _ev("sub_group", "{k} classes borrow {a} {items} each."),
        _ev("div", "They go equally onto {k} carts.", question="How many {items} go on each cart?"),
    ), "How many {items} are there now?",
        (("book", "books"), ("comic", "comics"), ("map", "maps"), ("atlas", "atlases"))),
    _Template("farm", _ev("start", "A farm has {a} {items}."), (
        _ev("add", "It buys {a} more {items}."),
        _ev("sub", "It sells {a} {items}."),
        _ev("add_group", "{k} trucks bring {a} {items} each."),
        _ev("mul", "Each {item} lays {k} eggs a week.", question="How many eggs is that a week?"),
    ), "How many {items} are there now?",
        (("hen", "hens"), ("duck", "ducks"), ("goose", "geese"), ("quail", "quails"))),
)
TEMPLATES = tuple(t.name for t in _TEMPLATES)
_BY_NAME = {t.name: t for t in _TEMPLATES}

_PEOPLE = (("Ava", "she"), ("Ben", "he"), ("Cara", "she"), ("Dan", "he"), ("Emma", "she"), ("Finn", "he"),
           ("Gia", "she"), ("Hugo", "he"), ("Ivy", "she"), ("Jack", "he"), ("Kim", "she"), ("Leo", "he"),
           ("Mia", "she"), ("Noah", "he"), ("Olga", "she"), ("Raj", "he"), ("Sara", "she"), ("Tom", "he"),
           ("Uma", "she"), ("Zed", "he"))


# --------------------------------------------------------------------------------------------- generation
def _draw(event: _Event, v: int, rng: random.Random, cfg: TaskConfig, cap: int) -> tuple | None:
    """Numbers for ``event`` on the running value ``v``: ``(a, k, steps, new v)``, or None when none fit [1, cap]."""
    ks = [k for k in event.ks if k <= cfg.max_number]
    kind = event.kind
    if kind == "start":
        if not event.group:
            a = rng.randint(2, min(cfg.max_number, cap))
            return a, None, [], a
        ks = [k for k in ks if 2 * k <= cap]
        if not ks:
            return None
        k = rng.choice(ks)
        a = rng.randint(2, min(cfg.max_number, cap // k))
        expr = f"{a}*{k}" if event.rate else f"{k}*{a}"
        return a, k, [(expr, a * k)], a * k
    if kind in ("add", "sub"):
        room = cap - v if kind == "add" else v - 1  # the result stays in [1, cap]
        if room < 1:
            return None
        a = rng.randint(1, min(cfg.max_number, room))
        new = v + a if kind == "add" else v - a
        return a, None, [(f"{v}{'+' if kind == 'add' else '-'}{a}", new)], new
    if kind == "mul":
        ks = [k for k in ks if v * k <= cap]
        if not ks:
            return None
        k = rng.choice(ks)
        return None, k, [(f"{v}*{k}", v * k)], v * k
    if kind == "div":
        ks = [k for k in ks if v % k == 0]
        if not ks:
            return None
        k = rng.choice(ks)
        return None, k, [(f"{v}/{k}", v // k)], v // k
    # add_group / sub_group: v ± k·a, the product first
    room = cap - v if kind == "add_group" else v - 1
    ks = [k for k in ks if k <= room]
    if not ks:
        return None
    k = rng.choice(ks)
    a = rng.randint(1, min(cfg.max_number, room // k))
    p = a * k
    new = v + p if kind == "add_group" else v - p
    product = f"{a}*{k}" if event.rate else f"{k}*{a}"
    return a, k, [(product, p), (f"{v}{'+' if kind == 'add_group' else '-'}{p}", new)], new


def _build(template: _Template, n_ops: int, rng: random.Random, cfg: TaskConfig) -> Problem | None:
    cap = min(cfg.max_value, template.cap or cfg.max_value)
    people = rng.sample(_PEOPLE, template.names)
    item, items = rng.choice(template.items)
    name, pronoun = people[0]
    words = {"N": name, "P": pronoun.capitalize(), "p": pronoun, "prev": name, "item": item, "items": items}
    drawn = _draw(template.start, 0, rng, cfg, cap)
    if drawn is None:
        return None
    a, k, steps, v = drawn
    sentences = [template.start.text.format(**words, a=a, k=k)]
    question = template.question
    n_person = 1
    while len(steps) < n_ops:
        left = n_ops - len(steps)
        candidates = [e for e in template.events if e.n_steps <= left and (e.question is None or e.n_steps == left)]
        rng.shuffle(candidates)
        for event in candidates:
            drawn = _draw(event, v, rng, cfg, cap)
            if drawn is not None:
                break
        else:
            return None
        a, k, new_steps, v = drawn
        if event.new_person:
            words["M"] = people[n_person][0]
            n_person += 1
        if event.text:
            sentences.append(event.text.format(**words, a=a, k=k))
        if event.new_person:
            words["prev"] = words["M"]
        if event.question is not None:
            question = event.question.format(**words, a=a, k=k)
        else:
            question = template.question
        steps += new_steps
    sentences.append(question.format(**words))
    text = " ".join(sentences)
    if len(text) > MAX_QUESTION_CHARS:  # a bound the tokenizer and sampler can rely on; rarely hit
        return None
    return Problem(text, v, tuple(steps), template.name)


def generate(rng: random.Random, config: TaskConfig | None = None) -> Problem:
    """One problem drawn with ``rng`` (template, operation count, names and numbers), from either split."""
    cfg = config or TaskConfig()
    templates = [_BY_NAME[t] for t in cfg.templates] if cfg.templates else _TEMPLATES
    for _ in range(1000):  # _build fails only on a rare over-long question
        problem = _build(rng.choice(templates), rng.randint(cfg.min_ops, cfg.max_ops), rng, cfg)
        if problem is not None:
            return problem
    raise RuntimeError(f"could not build a problem with {cfg}")


# ------------------------------------------------------------------------------------------------- splits
def normalize_question(question: str) -> str:
    """A problem's identity: its question in lower case with single spaces."""
    return " ".join(question.lower().split())


def split_of(question: str) -> str:
    """``"test"`` or ``"train"``: the one split this question can ever belong to (a hash bucket)."""
    digest = hashlib.blake2b(normalize_question(question).encode(), digest_size=8).digest()
    return "test" if int.from_bytes(digest, "big") / 2**64 < TEST_FRACTION else "train"


def _config(knobs: dict) -> TaskConfig:
    valid = {f.name for f in fields(TaskConfig)}
    unknown = sorted(set(knobs) - valid)
    if unknown:
        raise ValueError(f"unknown knobs {unknown}; valid: {', '.join(sorted(valid))}")
    return TaskConfig(**knobs)


def _stream(rng: random.Random, cfg: TaskConfig, split: str) -> Iterator[Problem]:
    """The problems ``rng`` generates that belong to ``split``, endlessly."""
    while True:
        problem = generate(rng, cfg)
        if split_of(problem.question) == split:
            yield problem


def iter_split(split: str = "train", seed: int = 0, **knobs) -> Iterator[Problem]:
    """An endless seeded stream of ``split``'s problems (repeats possible), e.g. fresh SFT batches."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    cfg = _config(knobs)
    rng = random.Random(f"{split}:{seed}")  # str seeds hash with sha512: the same stream in every process
    yield from _stream(rng, cfg, split)


MAX_PROBLEMS = 1_000_000
"""The most problems one split or pool is made of (about 40 s of one core): more would run for hours."""


def _distinct(stream: Iterator[Problem], n: int, what: str) -> list[Problem]:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if n > MAX_PROBLEMS:
        raise ValueError(f"at most {MAX_PROBLEMS:,} {what} problems are made at a time, {n:,} asked")
    seen: set[str] = set()
    out: list[Problem] = []
    budget = 50 * n + 10_000  # draws allowed between two new questions: a tiny question space runs out
    since_new = 0
    while len(out) < n:
        problem = next(stream)
        key = normalize_question(problem.question)
        if key in seen:
            since_new += 1
            if since_new > budget:
                raise ValueError(f"only {len(out)} distinct {what} problems exist with these knobs, {n} asked")
            continue
        since_new = 0
        seen.add(key)
        out.append(problem)
    return out


def make_split(n: int, split: str = "train", seed: int = 0, **knobs) -> list[Problem]:
    """``n`` distinct problems of ``split``, deterministic; a larger ``n`` extends a smaller one."""
    return _distinct(iter_split(split, seed, **knobs), n, split)


def make_pool(n: int, seed: int = 0, **knobs) -> list[Problem]:
    """A fixed list of ``n`` distinct training problems (SPO's pool), not ``make_split``'s stream."""
    return _distinct(_stream(random.Random(f"pool:{seed}"), _config(knobs), "train"), n, "train")


# ------------------------------------------------------------------------------------------ prompt, reward
def prompt(problem: Problem | str) -> str:
    """The model's input: the question and :data:`SEPARATOR` (used identically by SFT, sampling and eval)."""
    question = problem.question if isinstance(problem, Problem) else problem
    if not isinstance(question, str):
        raise ValueError(f"prompt needs a Problem or a question string, got {type(problem).__name__}")
    return question + SEPARATOR


def reward(problem: Problem, text: str, mode: str = "strict") -> float:
    """1.0 if the response ``text`` (without the prompt) gives ``problem``'s answer by rlkit's one answer rule
    (:func:`rlkit.tasks.gsm8k.score`, ``mode`` ``"strict"`` or ``"flexible"``), else 0.0."""
    return score(text, problem.answer, mode)


REWARD_RULES = ("answer", "digit")


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  rule: str = "answer", **kwargs) -> dict:
    """verl custom reward function: ``rule="answer"``, rlkit's one answer rule (:func:`reward`); ``"digit"``, a probe
    for plumbing runs of an untrained model (the answer's last digit anywhere: groups mix 0s and 1s)."""
    if rule not in REWARD_RULES:
        raise ValueError(f"unknown reward rule {rule!r}; valid: {', '.join(REWARD_RULES)}")
    if rule == "digit":
        acc = str(ground_truth).strip()[-1:] in solution_str
    else:
        acc = score(solution_str, ground_truth) == 1.0
    return {"score": float(acc), "acc": bool(acc)}
