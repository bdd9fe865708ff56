# ruff: noqa: RUF001, RUF002 - Russian text, not look-alike Latin letters
"""Search terms: the words of a query that matter, cut to stems for prefix matching, and how
well a note matches them.

FTS5's ``unicode61`` tokenizer splits the notes' folded text (see :func:`fold`); a query
becomes an OR of stem prefixes (``"moscow"* OR "москв"*``), so ``Москве`` finds ``Москва``,
``dogs`` finds ``dog`` and ``deployment`` finds ``deploys`` without a dictionary (:func:`stem`).
Words that carry no meaning (``the``, ``make``, ``что``, ``сделай``, ``ich``) and the words every
note is written with (``user``, ``пользователь``, ``Benutzer``) are left out, so a note is found
only through a word it shares with the query. Common verbs that are also facts (``live``,
``work``, ``play``) count only when every other word of the query is known to the memory:
"where do I live?" finds where the user lives, "how does TCP work?" finds no job.

The score (:func:`scores`) is measured in ``tests/test_memory_recall.py`` on the set in
``tests/memory_recall.json`` (docs/memory.md#retrieval).
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
    user users пользователь пользователя пользователю пользователем benutzer benutzers nutzer
    ich du er sie es wir ihr mir mich dir dich uns euch ihm ihn ein eine einer eines einem einen
    der die das des dem den und oder aber nicht kein keine keinen ist sind war waren bin bist hat
    habe haben hast wird werden wie was wer wo wann warum welche welcher welches welchen zu zum
    zur fur mit von vom auf aus bei nach uber unter am im an als auch noch schon nur dann ja nein
    doch mal soll sollte kann konnte will mochte muss mein meine meiner meinem meinen dein deine
    sein seine ihre bitte danke hallo gut sehr viel heute gestern jetzt hier dort machen mache
    macht sagen sag gibt geben gehen geht kommen kommt
    be have do come look use find call try feel become leave put mean keep begin seem talk turn
    start hear move believe hold bring happen provide sit stand lose meet include continue set
    lead understand follow stop create allow add appear wait serve send expect stay fall cut
    reach remain suggest raise pass require report decide pull explain compare recommend describe
    plan doing does did done gets getting making knows knew known thinks thought takes taking
    taken sees seeing seen comes coming came wants wanted looks looking looked uses used using
    calls called finds found gives given tells told tries tried asks asked needs needed feels
    felt leaves left puts means meant keeps kept lets begins began seems helps helped talks turns
    starts started shows showed hears heard brings happens happened sits stands loses lost meets
    includes sets leads led understands follows stops stopped creates allows adds appears waits
    serves sends sent expects stays stayed falls fell reaches remains suggests raises passes
    requires reports decides pulls explains compares recommends describes plans planned likes
    liked
    time year years day days week weeks month months people person part place case point number
    world fact kind sort bit
    быть был была были будет есть мочь могу может сказать говорить говорит знать знаю стать
    видеть хотеть хочет идти иду дать думать думаю делаю сделал понимать понять начать взять
    казаться смотреть ждать стоять сидеть нравиться нравится помнить помнишь время год года лет
    день дня неделя неделю дело человек место часть
"""
STOPWORDS = frozenset(_WORDS.split())

#: common verbs that a fact may be about ("lives in Lisbon", "plays chess", "работает учителем")
_WEAK_WORDS = """
    live lives lived living work works worked working play plays played playing run runs running
    ran read reads reading learn learns learned learnt learning write writes wrote written
    writing buy buys bought buying love loves loved speak speaks spoke watch watches watched walk
    walks walked win wins won pay pays paid spend spends spent meet grow grows grew build builds
    built sell sells sold eat eats ate drink drinks drank cook cooks cooked drive drives drove
    study studies studied teach teaches taught travel travels
    жить живу живет живёт живешь работать работает работаю играть играю играет читать читаю
    любить люблю любит
    wohnen wohne wohnt arbeiten arbeite arbeitet spielen spiele spielt lesen lese liest
"""


def fold(text: str) -> str:
    """Lower case, ``ё`` as ``е`` and no Latin diacritics (``café`` → ``cafe``). The index holds
    the folded text too (FTS5's ``remove_diacritics`` leaves Cyrillic alone, and Russian is
    written with ``е`` for ``ё`` as often as not)."""
    folded = text.casefold().replace("ё", "е")
    return folded if folded.isascii() else OTHER_SCRIPTS.sub(_strip_marks, folded)


def _strip_marks(match: re.Match[str]) -> str:
    decomposed = unicodedata.normalize("NFD", match.group())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


#: inflection endings of English and German words, longest first (:func:`stem`)
LATIN_ENDINGS = ("ments", "ings", "ment", "ness", "ing", "ies", "ied", "ers", "ern", "er", "ed",
                 "es", "en", "em", "ly", "s", "e", "t")  # fmt: skip
CYRILLIC_VOWELS = frozenset("аяоеыиуюьй")
_BY_LAST_LETTER: dict[str, tuple[str, ...]] = {}  # the endings a word may have, by its last letter
for _ending in LATIN_ENDINGS:
    _BY_LAST_LETTER[_ending[-1]] = (*_BY_LAST_LETTER.get(_ending[-1], ()), _ending)


def stem(word: str) -> str:
    """A prefix shared by the word's common forms, without a dictionary. A Latin word loses one
    English or German ending (``deployments`` → ``deploy``, ``dogs`` → ``dog``, ``trinkt`` →
    ``trink``), keeping three letters (four for ``-e``, ``-t``). A Cyrillic word longer than four
    letters loses up to three trailing letters, keeping four (``москве`` → ``моск``); one of four
    letters its final vowel (``сыну`` → ``сын``)."""
    if not word.isascii() and CYRILLIC.search(word):
        if len(word) > 4:
            return word[: max(4, len(word) - 3)]
        return word[:-1] if len(word) == 4 and word[-1] in CYRILLIC_VOWELS else word
    for ending in _BY_LAST_LETTER.get(word[-1], ()):
        if word.endswith(ending) and len(word) - len(ending) >= (4 if ending in ("e", "t") else 3):
            return word[: -len(ending)]
    return word


WEAK = frozenset(stem(w) for w in _WEAK_WORDS.split())


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


#: what may follow a stem of three letters or fewer in a word it matches (:func:`matched`)
_CYRILLIC_ENDINGS = """
    а я о е ы и у ю ь й ам ям ой ей ом ем ах ях ов ев ую юю ый ий ая ое ые их ым ого его ому ему
    ами ями ими ыми ет ешь ете ут ют ит ишь им ите ат ят ать ять ить ал ала али ла ли
"""
SHORT_ENDINGS = frozenset(LATIN_ENDINGS) | frozenset(_CYRILLIC_ENDINGS.split())


def matched(terms: list[str], folded: str) -> set[str]:
    """The terms a note's (folded) text has: a term of four letters or more as the start of one
    of its words (``deploy``: ``deployment``), a shorter one as a whole word or one with an
    inflection ending (``dog``: ``dogs``, not ``dogma``; ``git``: not ``gitarre``)."""
    words = WORD.findall(folded)
    joined = " " + " ".join(words)  # " w1 w2 …": " t" finds a word start
    found = set()
    for t in terms:
        if " " + t not in joined:
            continue
        if len(t) > 3 or any(
            w.startswith(t) and (len(w) == len(t) or w[len(t) :] in SHORT_ENDINGS) for w in words
        ):
            found.add(t)
    return found


def scores(terms: list[str], found: list[set[str]]) -> list[float]:
    """How well each note found matches the query, in [0, 1], from the terms each one has
    (:func:`matched`): the share of the query's terms known to the memory (those any note found
    has) that it has, three counting as a full match. Words of the query that no note has do
    not count, so "remind me about my dog again" gives the note about the dog a full score. A
    weak term (:data:`WEAK`) counts only when no other term of the query is unknown: "how does
    TCP work?" gives the note "works as a developer" 0."""
    known = set().union(*found)
    if any(t not in known and t not in WEAK for t in terms):
        known -= WEAK
    if not known:
        return [0.0] * len(found)
    full = min(len(known), 3)
    return [min(1.0, len(have & known) / full) for have in found]
