# ruff: noqa: RUF001, RUF002 - Russian text, not look-alike Latin letters
"""Search terms: the words of a query that matter, cut to stems for prefix matching.

FTS5's ``unicode61`` tokenizer splits the notes' folded text (see :func:`fold`); a query
becomes an OR of stem prefixes (``"moscow"* OR "москв"*``), so ``Москве`` finds ``Москва`` and
``names`` finds ``name`` without a language-specific stemmer (measured in
``tests/test_memory_md.py``). Words that carry no meaning (``the``, ``make``, ``что``, ``сделай``)
are left out, so a note is found only through a word it shares with the query.
"""

from __future__ import annotations

import re
import unicodedata

WORD = re.compile(r"\w+")
CYRILLIC = re.compile("[\u0400-\u04ff]")
OTHER_SCRIPTS = re.compile("[^\x00-\x7f\u0400-\u04ff]+")  # where diacritics are stripped

_WORDS = """
    a about above after again against all also am an and
    any are as at be because been before being below between both but by can could did do does
    doing done down during each few for from further had has have having he her here hers
    herself him himself his how i if in into is it its itself just let me more most my myself no
    nor not now of off on once only or other our ours ourselves out over own please same she
    should so some such than that the their theirs them themselves then there these they this
    those through to too under until up very was we were what when where which while who whom
    why will with would you your yours yourself yourselves tell know like want need get got hi
    hello hey thanks thank yes ok okay s t d ll m re ve don doesn didn isn aren wasn weren won
    wouldn shouldn can't и в во не что он на я с со как а то все она так его но да ты к у же вы
    за бы по только ее её мне было вот от меня еще ещё нет о из ему теперь когда даже ну вдруг
    ли если уже или ни быть был него до вас нибудь опять уж вам ведь там потом себя ничего ей
    может они тут где есть надо ней для мы тебя их чем была сам чтоб без будто чего раз тоже
    себе под будет ж тогда кто этот того потому этого какой совсем ним здесь этом один почти мой
    тем чтобы нее сейчас были куда зачем всех никогда можно при наконец два об другой хоть после
    над больше тот через эти нас про всего них какая много разве три эту моя впрочем хорошо свою
    этой перед иногда лучше чуть том нельзя такой им более всегда конечно всю между привет
    спасибо пожалуйста скажи знаешь мои моё мое мою моей моих
    make made makes go going goes went take took give gave say said see saw think thing things
    something anything way today now good new much many lot really right well still even back
    maybe sure help show ask any every
    это эта эти всё весь вся сделай сделать делать какие какое какую сегодня завтра очень
    просто ладно давай хочу можешь нужно расскажи покажи помоги сколько почему
"""
STOPWORDS = frozenset(_WORDS.split())


def fold(text: str) -> str:
    """Lower case, ``ё`` as ``е`` and no Latin diacritics (``café`` → ``cafe``). The index holds
    the folded text too (FTS5's ``remove_diacritics`` leaves Cyrillic alone, and Russian is
    written with ``е`` for ``ё`` as often as not)."""
    folded = text.casefold().replace("ё", "е")
    return folded if folded.isascii() else OTHER_SCRIPTS.sub(_strip_marks, folded)


def _strip_marks(match: re.Match[str]) -> str:
    decomposed = unicodedata.normalize("NFD", match.group())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def stem(word: str) -> str:
    """A prefix shared by the word's common forms, without a dictionary: a word longer than
    four letters loses up to three trailing letters if Cyrillic (Russian endings: ``москве`` →
    ``моск``), up to two otherwise (``names`` → ``name``), keeping four."""
    if len(word) <= 4:
        return word
    cut = 3 if CYRILLIC.search(word) else 2
    return word[: max(4, len(word) - cut)]


def query_terms(text: str, limit: int = 32) -> list[str]:
    """The distinct stems of the meaningful words of ``text``, in order (at most ``limit``)."""
    out: list[str] = []
    for word in WORD.findall(fold(text)):
        if len(word) < 2 or word in STOPWORDS or (word.isdigit() and len(word) < 3):
            continue
        s = stem(word)
        if s not in out:
            out.append(s)
            if len(out) == limit:
                break
    return out


def match_expression(terms: list[str]) -> str:
    """An FTS5 query: any of the terms as a prefix (each quoted, so no word is an operator)."""
    return " OR ".join(f'"{t}"*' for t in terms)


def relevance(terms: list[str], folded: str) -> float:
    """How well a note matches, in [0, 1]: the share of the query's terms its (folded) text
    contains, where three matched terms (or all of a shorter query's) count as a full match."""
    if not terms:
        return 0.0
    words = " " + " ".join(WORD.findall(folded))  # " w1 w2 …": " t" finds a word start
    matched = sum(1 for t in terms if " " + t in words)
    return min(1.0, matched / min(len(terms), 3))
