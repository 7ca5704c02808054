"""What a memory states a value of: a small rule set, in English and Chinese.

A memory whose sentence names a subject (a price of something, an IBAN, a SWIFT
code, an account number, a credit limit, an address, payment terms, a phone
number, an e-mail) and states its value there has that subject: the subject, then
a link (``is``, ``:``, ``changed to``, ``是``, ``改为``, ``从...改为``...) or nothing
(a label: ``IBAN GB33 ...``), then a value (a number, or an ``@`` for an e-mail).
A price may also be a verb: "M8 bolts now cost ...", "M8螺丝涨价到...". "My phone
battery died after 2 hours" and "我今天打了3个电话" name a subject and hold a
number, but state no value of it.
A newer memory with the same subject in the same scope supersedes the older one
(see :meth:`~langchain_tiered_memory.tiers.long_memory.catalog.Catalog.commit_plan`):
both are kept, and search ranks the newer first. Questions ("what is our IBAN?")
state no value and have no subject.

The rules are deliberately few and literal: a missed subject only means the older
value is not marked, never that anything is lost.
"""

from __future__ import annotations

import re

#: A subject key is at most this long (it is indexed in the catalog).
SUBJECT_CHARS = 120
# A decimal point ("0.12") does not end a sentence.
_SENTENCE = re.compile(r"(?:[^.!?。！？;；\n]|(?<=\d)\.(?=\d))+[.!?。！？;；]?")
_VALUE = re.compile(r"\d|@")
#: How far after its link a stated value may start, in characters ("net 30 days",
#: "上海市浦东新区世纪大道100号"); a number further on is about something else.
VALUE_REACH = 24
# A value right after the subject's name, as on a label: a code or number, an e-mail.
_LABELLED = re.compile(r"\s*(?:[a-z]{0,4}\d|[\w.+-]+@)")
# What joins a subject to the value stated of it, right after the subject's name or a
# short qualifier of it ("payment terms with ACME are ...", "address of the warehouse is").
_LINK = re.compile(
    r"""(?:\s+(?:with|for|of|at|from|in|on)\s+[\w&.'-]+(?:\s+[\w&.'-]+){0,2}?)?
    \s*(?:
        (?:(?:is|are|was|were|becomes|became|remains|stays|will\s+be|has\s+been|have\s+been)
           (?:\s+(?:now|still|currently))?\b)
      | (?:(?:has\s+|have\s+)?(?:changed|changes|went|goes|rose|rises|fell|falls|dropped|drops
            |increased|decreased|moved|moves|updated|switched)
           (?:\s+(?:up|down))?(?:\s+(?:to|from))?\b)
      | [:=：＝]
      | (?:号码|号)?(?:现在|目前|已经|已)?
        (?:从[^。！？；\n]{1,30}?)?  # "从月结30天改为月结60天": the old value, then the new
        (?:是|为|改为|改成|换成|变为|变成|更新为|调整为|调为|涨到|涨至|降到|降至|调到|调至|：|:)
    )""",
    re.VERBOSE,
)
_ITEM_END = r"(?=\s+(?:is|are|was|were|has|have|now|will|changed|went|goes|=)\b|\s*[:=,(]|\s*$)"
# An item is one to four words; the shortest that ends where the statement goes on.
_EN_ITEM = r"((?:[a-z0-9][a-z0-9\-]* ){0,3}?[a-z0-9][a-z0-9\-]*)"
# Where a Latin word starts and ends: ``\b`` fails beside Chinese, a word character too.
_B, _E = r"(?<![a-z0-9])", r"(?![a-z0-9])"
# Subjects named by a fixed phrase, English and Chinese alike, in the order tried.
_FIXED: dict[str, str] = {
    "iban": _B + r"iban" + _E,
    "swift": _B + r"(?:swift|bic)(?: code|码|代码|" + _E + ")",
    "email": _B + r"e-?mail(?: address)?" + _E + r"|电子邮件|邮箱",
    "account number": _B
    + r"(?:bank )?account (?:number|no\.?)"
    + _E
    + r"|账号|账户|帐号|帐户|卡号",
    "payment terms": _B
    + r"payment (?:terms?|conditions?)"
    + _E
    + r"|付款条件|付款方式|付款条款|账期|结算方式",
    "credit limit": _B + r"credit limit" + _E + r"|信用额度|授信额度",
    "phone": _B + r"(?:phone|telephone|mobile)(?: number)?" + _E + r"|电话|手机号|联系方式",
    "address": _B + r"address" + _E + r"|地址",
}
_ADVERB = r"(?: now| currently| still| will| from now on)?"
# A price names its item: "price of the M8 bolts", "M8 bolt price", "M8 bolts now cost",
# "M8螺丝的价格", "M8螺丝涨价到".
_PRICES = (
    _B + r"(?:unit )?(?:price|cost) (?:of|for) (?:the |an? |our |my )?" + _EN_ITEM + _ITEM_END,
    _B + r"(?:the |our |my )?" + _EN_ITEM + r"(?:'s)? (?:unit )?price" + _E,
    _B + r"(?:the |our |my )?" + _EN_ITEM + _ADVERB + r" costs?" + _E,
    r"([A-Za-z0-9\-\u4e00-\u9fff]{1,20})(?:的)?(?:单价|价格|售价|报价)",
    r"([A-Za-z0-9\-\u4e00-\u9fff]{1,20})(?:涨价|降价|提价|调价)(?:到|至|为)",
)
# (pattern, key); a key ending with ":" takes the captured item.
_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    *((re.compile(pattern), key) for key, pattern in _FIXED.items()),
    *((re.compile(pattern), "price:") for pattern in _PRICES),
)
# Words that come before a Chinese item without being part of it.
_ZH_SPLIT = re.compile(r"[把将是了在和与及为对从给让请：:，,\s]")
_ZH_PREFIXES = ("现在", "目前", "最新", "新的", "我们", "你们", "他们", "公司", "记住", "请")
_EN_STOP = frozenset(
    {"a", "an", "the", "our", "my", "your", "their", "new", "current", "old", "that", "this"}
    | {"these", "those", "and", "so", "then", "now", "is", "of", "for", "to", "said"}
    | {"it", "they", "we", "you", "i", "he", "she", "which", "what", "each", "will"}
)
# Words that say which kind of price, not what it is of: "the total cost", "the final price".
_EN_VAGUE = frozenset(
    {"total", "average", "overall", "final", "estimated", "approximate", "other", "extra"}
    | {"additional", "asking", "current", "usual", "normal", "full", "whole", "one"}
)


def subject_of(text: str) -> str | None:
    """The subject a memory text states a value of, or ``None``.

    Args:
        text: The memory's text (a raw turn's ``User: ...`` lines or a summary).

    Returns:
        A short key such as ``"iban"``, ``"address"``, ``"payment terms"`` or
        ``"price:m8 bolt"``; the same key in English and Chinese where the subject
        is the same (``"地址"`` is ``"address"``).
    """
    for sentence in _SENTENCE.findall(text[:4000]):
        sentence = sentence.strip()
        if not sentence or sentence[-1] in "?？" or not _VALUE.search(sentence):
            continue
        lowered = sentence.lower()
        for pattern, key in _RULES:
            for found in pattern.finditer(lowered):
                if not _states_value(lowered[found.end() :]):
                    continue
                if not key.endswith(":"):
                    return key
                item = _item(found.group(1))
                if item:
                    return (key + item)[:SUBJECT_CHARS]
    return None


def _states_value(rest: str) -> bool:
    """Whether the text after a subject's name links it to a value, or is one."""
    if _LABELLED.match(rest):  # "IBAN GB33 ...", "电话13800138000"
        return True
    link = _LINK.match(rest)
    if link is None:
        return False
    return _VALUE.search(rest, link.end(), link.end() + VALUE_REACH) is not None


def _item(raw: str) -> str:
    """The thing a price is of, normalised: ``"the M8 bolts"`` -> ``"m8 bolt"``."""
    if re.search(r"[\u4e00-\u9fff]", raw):
        piece = _ZH_SPLIT.split(raw.rstrip("的"))[-1]
        changed = True
        while changed:
            changed = False
            for prefix in _ZH_PREFIXES:
                if piece.startswith(prefix) and len(piece) > len(prefix):
                    piece, changed = piece[len(prefix) :], True
        return piece
    words = raw.split()
    stops = [i for i, w in enumerate(words) if w in _EN_STOP]
    words = words[stops[-1] + 1 :] if stops else words
    if not words or all(w.isdigit() or w in _EN_VAGUE for w in words):
        return ""
    last = words[-1]
    if len(last) > 3 and last.endswith("s") and not last.endswith("ss"):
        words[-1] = last[:-1]
    return " ".join(words)
