"""What a memory states a value of: a small rule set, in English and Chinese.

A memory whose sentence names a subject (a price of something, an IBAN, a SWIFT
code, an account number, a credit limit, an address, payment terms, a phone
number, an e-mail) and states its value there has that subject: the subject, then
a link (``is``, ``:``, ``changed to``, ``是``, ``改为``, ``从...改为``...) or nothing
(a label: ``IBAN GB33 ...``), then a value (a number, or an ``@`` for an e-mail).
A price may also be a verb: "M8 bolts now cost ...", "M8螺丝涨价到...". "My phone
battery died after 2 hours" and "我今天打了3个电话" name a subject and hold a
number, but state no value of it.
A subject may name whose it is: "ACME's IBAN", "the payment terms with ACME",
"ACME的IBAN" are ``"iban of acme"``, ``"payment terms of acme"``; "our IBAN",
"我们的IBAN" are ``"iban of ours"``; "the IBAN" names nobody, and "their IBAN" or
"the supplier's IBAN" (somebody, not known who) has no subject at all
(:func:`family_of` is the subject without its owner).
A newer memory with the same subject in the same scope supersedes the older one
(see :meth:`~langchain_tiered_memory.tiers.long_memory.catalog.Catalog.supersede_plan`):
both are kept, and search ranks the newer first. One that names an owner
supersedes that owner's only, so ACME's IBAN never buries Globex's, nor our own.
One that names nobody is about the one owner its scope has ever named (after
"ACME's terms are net 30", "the terms are now net 60" is ACME's), and with several
supersedes nothing, as whose it is is unknown.
Questions ("what is our IBAN?") state no value and have no subject.

The rules are deliberately few and literal: a missed subject only means the older
value is not marked, never that anything is lost.
"""

from __future__ import annotations

import re

#: A subject key is at most this long (it is indexed in the catalog).
SUBJECT_CHARS = 120
#: Between a subject and its owner in a key: ``"iban of acme"``.
OWNER_SEPARATOR = " of "
# A sentence ends at . ! ? ; but not at a dot inside a token ("0.12", "Jane.Doe@",
# "acme.com") nor at "No." ("account No. 42").
_SENTENCE = re.compile(r"(?:[^.!?。！？;；\n]|(?<=\w)\.(?=\w)|(?<=\b[Nn]o)\.)+[.!?。！？;；]?")
_VALUE = re.compile(r"\d|@")
#: How far after its link a stated value may start, in characters ("net 30 days",
#: "上海市浦东新区世纪大道100号"); a number further on is about something else.
VALUE_REACH = 24
# A value right after the subject's name, as on a label: a code or number (with a
# currency before it), an e-mail.
_LABELLED = re.compile(
    r"\s*+(?:[a-z]{0,4}\d|(?:eur|usd|gbp|cny|rmb|jpy|chf|hkd)\s?\d|[€$£¥￥]\s?\d|[\w.+-]++@)"
)
# What joins a subject to the value stated of it, right after the subject's name or a
# short qualifier of it ("payment terms with ACME are ...", "address of the warehouse is").
_LINK = re.compile(
    r"""(?:\s+(?P<preposition>with|for|of|at|from|in|on)
        \s+(?P<owner>[\w&.'-]+(?:\s+[\w&.'-]+){0,2}?))?
    \s*(?:
        (?:(?:is|are|was|were|becomes|became|remains|stays|will\s+be|has\s+been|have\s+been)
           (?:\s+(?:now|still|currently))?\b)
      | (?:(?:has\s+|have\s+)?(?:changed|changes|went|goes|rose|rises|fell|falls|dropped|drops
            |increased|decreased|moved|moves|updated|switched|raised|lowered|reduced)
           (?:\s+(?:up|down))?(?:\s+(?:to|from))?\b)
      | [:=：＝]
      | (?:号码|号)?(?:现在|目前|已经|已)?
        (?:[从由][^。！？；\n]{1,30}?)?  # "从月结30天改为月结60天": the old value, then the new
        (?:是|为|改为|改成|改到|换成|变为|变成|变更为|变更成|更新为|调整为|调为|调到|调至
            |涨到|涨至|降到|降至|提高到|提高至|提升到|上调到|上调至|上调为|下调到|下调至|下调为
            |降低到|降低至|增加到|增加至|减少到|减少至|延长到|延长至|缩短到|缩短至|：|:)
    )""",
    re.VERBOSE,
)
# After "is"/"was": words that say the sentence is about something else than the
# value ("the IBAN is not ...", "payment terms were discussed on 5 May"). A verb that
# leads to the value ("is fixed at", "is listed as", "was raised to") does not.
_NOT_A_VALUE = re.compile(
    r"\s*(?:(?:not|never|no\s+longer)\b"
    r"|\w+ed\s+(?:on|in|with|about|during|after|before|since|until|for|yesterday|today"
    r"|last|again|twice|once|recently|earlier|already|\w+ly)\b)"
)
_ITEM_END = (
    r"(?=\s+(?:is|are|was|were|has|have|now|will|changed|went|goes|rose|rises|fell|falls"
    r"|dropped|drops|increased|decreased|moved|raised|=)\b|\s*[:=,(]|\s*$)"
)
# An item is one to four words; the shortest that ends where the statement goes on.
# Possessive words: a long run of hyphens fails at once instead of at every split.
_EN_ITEM = r"((?:[a-z0-9][a-z0-9\-]*+ ){0,3}?[a-z0-9][a-z0-9\-]*+)"
# Where a Latin word starts and ends: ``\b`` fails beside Chinese, a word character too.
# An item starts no later than its word does ("ACME's", "M8-bolt").
_B, _E = r"(?<![a-z0-9])", r"(?![a-z0-9])"
_ITEM_START = r"(?<![a-z0-9'\-])"
# Subjects named by a fixed phrase, English and Chinese alike, in the order tried.
_FIXED: dict[str, str] = {
    "iban": _B + r"iban" + _E,
    "swift": _B + r"(?:swift|bic)(?: code|码|代码|" + _E + ")",
    "email": _B + r"e-?mail(?: address)?" + _E + r"|电子邮件(?:地址)?|邮箱(?:地址)?",
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
    # Not an IP, MAC or memory address.
    "address": _B + r"(?<!ip )(?<!mac )(?<!memory )(?<!pointer )address" + _E + r"|地址",
}
# The shape a subject's value has within reach (a number, when not listed): an e-mail
# has an @, a phone number five digits, an IBAN its country and check digits, an
# address a number that is not a year, a time or a share.
_SHAPES: dict[str, str] = {
    "iban": r"[a-z]{2}\s?\d{2}",
    "swift": r"[a-z]{6}[a-z0-9]{2}",
    "email": r"@",
    "account number": r"\d(?:[\s-]?\d){3}",
    "phone": r"\d(?:[\s\-().]?\d){4}",
    "address": r"\d++(?!\s*(?:年|点|%|percent|years?\b|minutes?\b|hours?\b|days?\b))",
}
_AMOUNT = r"\d"
_ADVERB = r"(?: now| currently| still| will| from now on| typically| usually| also| only)?"
# A price names its item: "price of the M8 bolts", "M8 bolt price", "M8 bolts now cost",
# "M8螺丝的价格", "M8螺丝涨价到".
_PRICES = (
    _B + r"(?:unit )?(?:price|cost) (?:of|for) (?:the |an? |our |my )?" + _EN_ITEM + _ITEM_END,
    _ITEM_START + r"(?:the |our |my )?" + _EN_ITEM + r"(?:'s)? (?:unit )?price" + _E,
    _ITEM_START + r"(?:the |our |my )?" + _EN_ITEM + _ADVERB + r" costs?" + _E,
    r"([A-Za-z0-9\-\u4e00-\u9fff]{1,20})(?:的)?(?:单价|价格|售价|报价)",
    r"([A-Za-z0-9\-\u4e00-\u9fff]{1,20})(?:涨价|降价|提价|调价)(?:到|至|为)",
)
# (pattern, the shape of its value, key); a key ending with ":" takes the captured item.
_RULES: tuple[tuple[re.Pattern[str], re.Pattern[str], str], ...] = (
    *(
        (re.compile(name), re.compile(_SHAPES.get(key, _AMOUNT)), key)
        for key, name in _FIXED.items()
    ),
    *((re.compile(pattern), re.compile(_AMOUNT), "price:") for pattern in _PRICES),
)
# "M6 螺丝" is one item: a model number stays with the Chinese noun after it.
_LATIN_SPACE_CJK = re.compile(r"(?<=[a-zA-Z0-9])\s+(?=[\u4e00-\u9fff])")
# Words that come before a Chinese item without being part of it.
_ZH_SPLIT = re.compile(r"[把将是了和与及为对从给让请说：:，,\s]")
_ZH_PREFIXES = (
    *("现在", "目前", "最新", "新的", "我们", "你们", "他们", "公司", "记住", "请"),
    *("注意", "记得", "好的", "今年", "明年", "最近", "以后", "采购的"),
)
# Words that lead in to a model number ("供应商通知M8螺丝"): dropped only before one, as
# they can start an item too ("通知书", "供应商名录").
_ZH_LEADS = ("供应商", "通知")
# Words after a Chinese item that say when, not what ("M8螺丝现在的价格").
_ZH_SUFFIXES = ("现在", "目前", "当前", "最新", "今年", "的")
# Chinese items that name no thing: "它的价格", "总价格", "平均价格".
_ZH_VAGUE = frozenset(
    {"它", "这", "这个", "那", "那个", "这些", "那些", "总", "平均", "单", "其他"}
)
#: The owner of what we state of ourselves: "our IBAN", "我们的IBAN" are ``"iban of ours"``.
SELF = "ours"
# An owner named but not known ("their IBAN", "the supplier's IBAN", "他的电话"): such a
# sentence gets no subject, as it could be anybody's.
_UNKNOWN = "?"
_LATIN = "a-z0-9\u00c0-\u024f&"  # letters of names such as "Müller", "Nestlé"
# Whose a subject is, right before its name, with at most two words between ("ACME's
# IBAN", "Globex Corp's UK IBAN", "our new IBAN"); words that end the phrase ("and",
# "says") cannot come between.
_EN_POSSESSIVE = re.compile(
    rf"(?<![{_LATIN}.'\-])"
    rf"(?:(?:([{_LATIN}][{_LATIN}.\-]*+)\s++)?([{_LATIN}][{_LATIN}.\-]*+)'s?"
    r"|(our|my|your|their|his|her|its))\s++"
    r"((?:(?!(?:and|or|the|a|an|our|my|your|their|his|her|its|is|are|was|were|to|of|for"
    rf"|with|that|this|not|says|said)\s)[{_LATIN}\-]++\s++){{0,2}})$"
)
# Words between "our" and the subject that keep it ours even in capitals: "Our New IBAN".
_EN_PLAIN = frozenset(
    {"new", "current", "old", "updated", "latest", "correct", "bank", "main", "primary"}
    | {"registered", "billing", "shipping", "delivery", "office", "contact", "official"}
    | {"default", "usual", "company", "business", "own", "full", "postal", "mailing"}
)
# "For ACME, the IBAN is ...": the owner leads the sentence.
_EN_LEAD = re.compile(
    rf"(?<![{_LATIN}])(?:for|with|at)\s++((?:[{_LATIN}][{_LATIN}.\-]*+\s*+){{1,3}}),"
    r"\s*+(?:(?:the|its|their)\s++)?$"
)
# What leads a sentence without naming anybody: "For reference, the IBAN is ...".
_EN_LEAD_WORDS = frozenset(
    {"record", "reference", "information", "info", "moment", "example", "instance", "now"}
    | {"effect", "immediate effect", "clarity", "context", "convenience", "completeness"}
    | {"today", "future", "time being", "avoidance", "short", "sure", "least", "most"}
)
# A name in capitals right before the subject ("ACME IBAN: ...", "ACME BILLING ADDRESS"),
# with up to two plain words or acronyms between.
_EN_CAPITALS = re.compile(r"(?<![\w&.'\-])([A-Z][A-Z0-9&]{1,15})\s++((?:[A-Za-z]++\s++){0,2})$")
# Capitals that are no name: "EUR IBAN", "UK phone", "NEW IBAN".
_EN_ACRONYMS = frozenset(
    {"iban", "eur", "usd", "gbp", "cny", "rmb", "uk", "eu", "us", "swift", "bic", "vat", "po"}
    | {"id", "new", "our", "the", "my", "your", "old", "sepa", "erp", "crm", "hq", "no", "ok"}
    | {"please", "note", "fyi", "update", "updated", "correction", "current", "main", "bank"}
    | {"ps", "pps", "nb", "btw", "attn", "re", "fw", "fwd", "edit", "todo", "imo", "imho", "afaik"}
    | {"fwiw", "asap", "eta", "tbd", "cc", "bcc", "pls", "plz", "hi", "dear", "thanks", "urgent"}
    | {"important", "reminder", "info", "faq", "warning", "notice", "attention", "action"}
)
_ZH_POSSESSIVE = re.compile(r"([a-z0-9&.\-\u4e00-\u9fff]{1,20})的[\u4e00-\u9fff]{0,3}$")
# Ours; "your" and "you" are the assistant's in the user's words and the user's in the
# assistant's, so they are not known.
_EN_PRONOUNS = {"our": SELF, "my": SELF, "us": SELF, "me": SELF}
# Not a possessive: "let's", "it's", "that's" (``'s`` is "is" or "us").
_EN_NOT_OWNERS = frozenset(
    {"let", "it", "that", "what", "here", "there", "who", "he", "she", "where", "how", "one"}
)
# A time names nobody: "today's price", "last year's terms".
_EN_TIMES = frozenset(
    {"today", "yesterday", "tomorrow", "tonight", "week", "month", "year", "quarter", "day"}
    | {"q1", "q2", "q3", "q4", "january", "february", "march", "april", "may", "june", "july"}
    | {"august", "september", "october", "november", "december", "monday", "tuesday"}
    | {"wednesday", "thursday", "friday", "saturday", "sunday", "weekend", "season"}
)
# What a link names that is a purpose, not an owner ("the address for invoices"): such a
# sentence gets no subject.
_EN_PURPOSES = frozenset(
    {"order", "orders", "invoice", "invoices", "payment", "payments", "transfer", "transfers"}
    | {"delivery", "deliveries", "refund", "refunds", "return", "returns", "shipping"}
)
# Where a link's owner ends: "with ACME since January".
_EN_OWNER_END = frozenset(
    {"since", "starting", "from", "until", "as", "after", "before", "effective", "now"}
)
# A role is nobody in particular: "the supplier's IBAN" is some supplier's.
_EN_ROLES = frozenset(
    {"supplier", "vendor", "customer", "client", "partner", "ceo", "manager", "bank"}
    | {"suppliers", "vendors", "customers", "clients", "partners", "they", "them", "him"}
    | {"his", "her", "their", "its"}
)
# Ourselves, as a user or an assistant writes it.
_EN_SELF = frozenset({"company", "firm", "business"})
# A name's last word that needs the word before it: "Globex Corp", "ACME Ltd".
_EN_CORPORATE = frozenset(
    {"corp", "inc", "ltd", "llc", "gmbh", "co", "plc", "ag", "sa", "group", "holdings"}
)
_ZH_SELF = frozenset(
    {"我们", "我司", "我方", "本公司", "公司", "咱们", "我", "我们公司", "我公司", "本人"}
)
_ZH_OTHERS = ("他们", "她们", "它们", "对方", "他", "她", "它", "其", "你们", "你", "您")
_ZH_ROLES = ("供应商", "客户", "厂商", "厂家", "通知")
# Pure-Chinese owners are names of these kinds: "华东仓库", "张经理", "中国银行".
_ZH_ENTITIES = (
    *("公司", "集团", "仓库", "工厂", "厂", "门店", "店", "银行", "经理", "总", "先生"),
    *("女士", "老师", "部", "中心", "分行", "支行", "大学", "医院"),
)
# Words before the 的 that say which, not whose: "合同约定的付款条件", "最近的地址".
_ZH_WHICH = frozenset(
    {"合同", "约定", "合同约定", "最近", "现在", "目前", "当前", "原来", "以前", "之前", "新"}
    | {"旧", "最新", "默认", "正确", "实际", "原", "常用", "上述", "以上", "下面", "最终"}
    | {"这次", "本次", "上次", "新版", "当时", "今后", "将来"}
)
_ZH_TIME = frozenset("年月日天周")
# An owner's place that is a time: "2024年的", "3月份的", "调整后的" ("1号仓库的" is a name).
_ZH_WHEN = re.compile(r"\d[年月日号]?$|月份$|(?:调整|变更|修改|更新|变动|改)后$")
# Words before an owner that are no part of it: "付到ACME的IBAN", "跟ACME的付款条件".
# ("ACME给我们的付款条件" is ACME's.)
_ZH_OWNER_SPLIT = re.compile(r"[把将是了和与及对从让请说到向在按跟找问：:，,\s]")
_EN_STOP = frozenset(
    {"a", "an", "the", "our", "my", "your", "their", "new", "current", "old", "that", "this"}
    | {"these", "those", "and", "so", "then", "now", "is", "of", "for", "to", "said"}
    | {"it", "they", "we", "you", "i", "he", "she", "which", "what", "each", "will"}
    | {"them", "both", "all", "some", "ones"}
    | {"might", "may", "could", "would", "should", "can", "must", "does", "do", "did"}
    | {"says", "said", "heard", "apparently", "reported", "wrote", "confirmed", "told"}
    | {"since", "that"}
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
        cased = _LATIN_SPACE_CJK.sub("", sentence.replace("’", "'"))
        lowered = cased.lower()
        if len(lowered) != len(cased):  # a letter whose lower case is longer ("İ")
            cased = lowered
        for pattern, value, key in _RULES:
            for found in pattern.finditer(lowered):
                after = _states_value(lowered[found.end() :], value)
                if after is None:
                    continue
                if key.endswith(":"):
                    item = _item(found.group(1))
                    if not item:
                        continue
                    key += item
                owner = _owner_before(lowered[: found.start()], cased[: found.start()])
                if key.startswith("price:"):  # a price is the seller's: only a name counts
                    owner = "" if owner in (None, SELF, _UNKNOWN) else owner
                elif owner is None:
                    owner = _link_owner(after)
                if owner == _UNKNOWN:
                    continue
                if not owner:
                    return key[:SUBJECT_CHARS]
                # Room for the owner: a long item must not cut it off, leaving a key
                # that names nobody.
                return key[:80] + OWNER_SEPARATOR + owner[:36]
    return None


def family_of(subject: str) -> str:
    """A subject without its owner: ``"iban of acme"`` -> ``"iban"``."""
    return subject.split(OWNER_SEPARATOR, 1)[0]


def _states_value(rest: str, value: re.Pattern[str]) -> str | None:
    """Whether the text after a subject's name links it to a ``value``, or is one.

    Returns:
        ``None`` if it states no value, else the words of the owner the link
        names ("the payment terms *with ACME* are ..."), or ``""``.
    """
    if _LABELLED.match(rest):  # "IBAN GB33 ...", "电话13800138000"
        start, owner = 0, ""
    else:
        link = _LINK.match(rest)
        if link is None or _NOT_A_VALUE.match(rest, link.end()):
            return None
        start = link.end()
        named = link.group("preposition") in ("with", "for", "of")
        owner = link.group("owner") if named else ""
    if value.search(rest[start : start + VALUE_REACH + 16]) is None:
        return None
    return owner


def _owner_before(head: str, cased: str) -> str | None:
    """Whose subject the words right before it name ("ACME's", "our", "ACME的").

    Args:
        head: The sentence before the subject's name, lower case.
        cased: The same, as written (an upper-case name: "ACME IBAN").

    Returns:
        ``None`` if they name nobody, else the owner, :data:`SELF`, ``""`` (a
        time or a "which": "today's", "最近的") or ``_UNKNOWN``.
    """
    tail, cased_tail = head[-80:], cased[-80:]
    found = _EN_POSSESSIVE.search(tail)
    if found is not None:
        before, word, pronoun, _ = found.groups()
        if pronoun is not None:
            # "our warehouse address" is ours; "our ACME account" is not known to be.
            between = cased_tail[found.start(4) : found.end(4)].split()
            plain = all(w.lower() in _EN_PLAIN or w.islower() for w in between)
            return _EN_PRONOUNS.get(pronoun, _UNKNOWN) if plain else _UNKNOWN
        return _en_possessive(before, word)
    found = _ZH_POSSESSIVE.search(tail)
    if found is not None:
        return _zh_owner(found.group(1))
    found = _EN_LEAD.search(tail)  # "For ACME, the IBAN is ..."
    if found is not None:
        owner = _link_owner(found.group(1))
        if owner in (SELF, _UNKNOWN, ""):
            return owner
        # A name is written with a capital: "For the record, ..." names nobody.
        lead = cased_tail[found.start(1) : found.end(1)]
        at = found.group(1).rfind(owner.split()[0])
        return None if owner in _EN_LEAD_WORDS or not lead[at : at + 1].isupper() else owner
    found = _EN_CAPITALS.search(cased_tail)  # "ACME IBAN: ...", "HSBC account number"
    if found is None:
        return None
    name, between = found.group(1).lower(), found.group(2).split()
    # Between: plain words ("ACME BILLING ADDRESS") or acronyms in capitals ("HSBC UK
    # IBAN"), not a sentence's words ("Email ACME the new IBAN": ACME is addressed).
    if any(
        word.lower() not in _EN_PLAIN and not (word.isupper() and word.lower() in _EN_ACRONYMS)
        for word in between
    ):
        return None
    if name in _EN_ROLES or name in _EN_PURPOSES:  # "SUPPLIER IBAN": somebody's
        return _UNKNOWN
    if name in _EN_ACRONYMS or name in _EN_PLAIN:
        return None
    return name


def _en_possessive(before: str | None, word: str) -> str | None:
    """The owner of ``word's``: ``"acme"``, ``"globex corp"``; see :func:`_owner_before`."""
    word = word.strip(".")
    if word in _EN_NOT_OWNERS:
        return None
    if word in _EN_TIMES or word.isdigit():
        return ""
    if word in _EN_SELF:
        return SELF
    if word in _EN_ROLES:
        return _UNKNOWN
    if before is not None and word in _EN_CORPORATE:
        return f"{before.strip('.')} {word}"
    return word


def _link_owner(raw: str) -> str:
    """The owner a link names ("with our supplier ACME" -> ``"acme"``), or ``""``."""
    words = [word.strip(".'") for word in raw.split()]
    ends = [i for i, w in enumerate(words) if w in _EN_OWNER_END]
    words = words[: ends[0]] if ends else words
    if len(words) == 1 and words[0] in _EN_PRONOUNS:
        return _EN_PRONOUNS[words[0]]
    if words and words[-1] in _EN_ROLES | {"you"}:
        return _UNKNOWN
    stops = [i for i, w in enumerate(words) if w in _EN_STOP]
    words = words[stops[-1] + 1 :] if stops else words
    while len(words) > 1 and words[0] in _EN_ROLES:
        words = words[1:]
    if any(w in _EN_PURPOSES for w in words):
        return _UNKNOWN
    if not words or any(not w or w in _EN_TIMES or any(c.isdigit() for c in w) for w in words):
        return ""
    return " ".join(words)


def _zh_owner(raw: str) -> str:
    """A Chinese owner; see :func:`_owner_before`: ``"供应商ACME"`` -> ``"acme"``."""
    piece = _strip(_ZH_OWNER_SPLIT.split(raw)[-1], _ZH_PREFIXES, from_end=False)
    if _ZH_WHEN.search(piece):  # "2024年的", "3月份的", "调整后的"
        return ""
    # "acme签", "acme新", "acme给我们": the name; a number is none ("1号仓库").
    latin = [run for run in re.findall(r"[a-z0-9&][a-z0-9&.\-]*+", piece) if not run.isdigit()]
    if latin:
        return latin[-1].strip(".")
    if piece in _ZH_SELF:
        return SELF
    if piece.endswith(_ZH_OTHERS) or piece in _ZH_ROLES:
        return _UNKNOWN
    lead = re.match(f"(?:{'|'.join(_ZH_ROLES)})+(?=.)", piece)
    if lead is not None:
        piece = piece[lead.end() :]
    if piece.endswith(_ZH_ENTITIES):
        return piece
    if not piece or piece in _ZH_WHICH or piece[-1] in _ZH_TIME:
        return ""
    return _UNKNOWN


def _item(raw: str) -> str:
    """The thing a price is of, normalised: ``"the M8 bolts"`` -> ``"m8 bolt"``."""
    if re.search(r"[\u4e00-\u9fff]", raw):
        return _zh_item(raw)
    words = raw.split()
    stops = [i for i, w in enumerate(words) if w in _EN_STOP]
    words = words[stops[-1] + 1 :] if stops else words
    if not words or all(w.isdigit() or w in _EN_VAGUE for w in words):
        return ""
    last = words[-1]
    if len(last) > 3 and last.endswith("s") and not last.endswith("ss"):
        words[-1] = last[:-1]
    return " ".join(words)


def _zh_item(raw: str) -> str:
    """A Chinese item without the words around it: ``"供应商通知M8螺丝"`` -> ``"m8螺丝"``."""
    piece = _ZH_SPLIT.split(_strip(raw, _ZH_SUFFIXES, from_end=True))[-1]
    piece = _strip(piece, _ZH_PREFIXES, from_end=False)
    lead = re.match(f"(?:{'|'.join(_ZH_LEADS)})+(?=[a-z0-9])", piece)
    if lead is not None:  # "供应商通知m8螺丝" -> "m8螺丝"; "不锈钢m8螺丝" stays
        piece = piece[lead.end() :]
    return "" if piece in _ZH_VAGUE else piece


def _strip(piece: str, words: tuple[str, ...], *, from_end: bool) -> str:
    """``piece`` without any of ``words`` at its start (or end), as often as they come."""
    changed = True
    while changed:
        changed = False
        for word in words:
            if len(piece) > len(word) and (
                piece.endswith(word) if from_end else piece.startswith(word)
            ):
                piece = piece[: -len(word)] if from_end else piece[len(word) :]
                changed = True
    return piece
