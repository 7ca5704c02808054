"""Updates win: a newer value of the same subject ranks first, the older one is kept.

Issue 13 item 4. In raw mode a memory's subject (a price of something, an IBAN,
an address, payment terms...) is found by rule, in English and Chinese; the newer
memory of a subject supersedes the older one of its scope, which stays in the
catalog with its provenance, marked ``superseded_by``. With an LLM extractor the
prompt offers the scope's nearest memories and the model may answer
``UPDATE <id>: new text``; an id it was not offered is never applied.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from langchain_tiered_memory import MySQLBackup, TieredChatMessageHistory
from langchain_tiered_memory.core.validation import SESSION_DATE_KEY
from langchain_tiered_memory.tiers.extraction import parse_update
from langchain_tiered_memory.tiers.long_memory import ChromaLongMemory
from langchain_tiered_memory.tiers.long_memory.subjects import family_of, subject_of

from .fakes import RecordingChatModel, replies
from .long_memory_support import catalog, turn_ids

MakeMemory = Callable[..., ChromaLongMemory]


def tell(
    backup: MySQLBackup,
    memory: ChromaLongMemory,
    session_id: str,
    text: str,
    when: str | None = None,
    user_id: str | None = "u1",
) -> None:
    """One turn of a session (dated when ``when`` is given)."""
    extra = {} if when is None else {SESSION_DATE_KEY: when}
    TieredChatMessageHistory(
        session_id, user_id=user_id, backup=backup, long_memory=memory
    ).add_messages([HumanMessage(text, additional_kwargs=extra), AIMessage("OK.")])


def rows_by_text(backup: MySQLBackup) -> dict[str, Any]:
    """Catalog rows keyed by the first line of their text."""
    return {row.text.splitlines()[0]: row for row in catalog(backup)}


def superseded_by(backup: MySQLBackup) -> dict[str, str]:
    """What each superseded memory is superseded by, as the texts its user said."""
    rows = rows_by_text(backup)
    text_of = {row.id: key.split(": ", 1)[-1] for key, row in rows.items()}
    return {
        text_of[row.id]: text_of[row.superseded_by]
        for row in rows.values()
        if row.superseded_by is not None
    }


# -- the subject rules -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "subject"),
    [
        ("User: The price of the M8 bolts is 0.12 EUR.", "price:m8 bolt"),
        ("User: Our M8 bolt price went up to 0.15 EUR.", "price:m8 bolt"),
        ("User: Our IBAN is DE89 3704 0044 0532 0130 00.", "iban of ours"),
        ("User: Payment terms are net 30 days.", "payment terms"),
        ("User: Ship to our new address: 12 Harbour Road, Leeds.", "address of ours"),
        ("用户：M8螺丝的价格是0.12元", "price:m8螺丝"),
        ("用户：我们把M8螺丝的价格改为0.15元", "price:m8螺丝"),
        ("用户：收货地址改为上海市浦东新区世纪大道100号", "address"),
        ("用户：付款条件是月结60天", "payment terms"),
        ("用户：我们的银行账号是6222 0000 1111", "account number of ours"),
        # No value stated, or not a known subject: no subject.
        ("User: What is the price of the M8 bolts?", None),
        ("User: I like the new address book.", None),
        ("用户：M8螺丝的价格是多少？", None),
        ("User: I run 3 times a week.", None),
        # A subject and a number in one sentence, but no value stated of the subject.
        ("User: My phone battery died after 2 hours.", None),
        ("用户：我今天打了3个电话", None),
        ("User: I sent 3 emails to the IBAN team.", None),
        ("User: The address book has 250 entries.", None),
        ("User: I sent my email to 3 customers.", None),
        ("User: My phone now has 3 cameras.", None),
        ("User: The address is a long walk from here, about 20 minutes.", None),
        ("用户：地址簿里有250个联系人", None),
        ("User: My phone number is 555-0100.", "phone of ours"),
        ("用户：我的电话号码是13800138000", "phone of ours"),
        ("User: The IBAN team says our IBAN is GB33 BUKB 2020 1555 5555 55.", "iban of ours"),
        ("User: Our address changed to 5 Mill Lane.", "address of ours"),
        # Other wordings of the same subjects: a verb for the price, the old value
        # before the new, a Latin name inside Chinese, a decimal point mid-sentence.
        ("User: M8 bolts now cost 0.15 EUR each.", "price:m8 bolt"),
        ("User: The unit cost of M8 bolts is 0.12 EUR.", "price:m8 bolt"),
        ("User: Payment terms changed from net 30 to net 60.", "payment terms"),
        ("用户：新的IBAN是GB33 BUKB 2020 1555 5555 55", "iban"),
        ("用户：付款条件从月结30天改为月结60天", "payment terms"),
        ("用户：M8螺丝的单价从0.12元调整为0.15元", "price:m8螺丝"),
        ("用户：M8螺丝涨价到0.15元", "price:m8螺丝"),
        ("User: Our credit limit is now 50,000 EUR.", "credit limit of ours"),
        ("用户：信用额度调整为50万元", "credit limit"),
        ("User: The SWIFT code is DEUTDEFF500.", "swift"),
        ("用户：我们的SWIFT码是BKCHCNBJ110", "swift of ours"),
        # A price of nothing named, a cost that is no price, no value after the link.
        ("User: It costs 20 EUR.", None),
        ("User: The total cost is 300 EUR.", None),
        ("User: It will cost us 3 days.", None),
        ("User: How much do the M8 bolts cost now? 3 boxes?", None),
        ("用户：我把地址从3个地方汇总了一下", None),
        ("User: I read the swiftly written memo 3 times.", None),
        # More wordings: a dot inside an e-mail, "No.", a currency before the amount,
        # the owner before the item, the words around a Chinese item.
        ("User: My email is now jane.doe@acme.com", "email of ours"),
        ("User: Our account no. is now 87654321", "account number of ours"),
        ("User: M8 bolts now cost €0.15", "price:m8 bolt"),
        ("User: M8 bolts now cost EUR 0.15", "price:m8 bolt"),
        ("User: The price of M8 bolts increased to 0.15 EUR", "price:m8 bolt"),
        ("User: ACME's M8 bolt price is now 0.15", "price:m8 bolt of acme"),
        ("User: The price of the M8 bolts was raised to 0.15 EUR.", "price:m8 bolt"),
        ("User: Our phone number has been changed to 555-0100.", "phone of ours"),
        ("User: Our address is now No. 5 Mill Lane", "address of ours"),
        ("用户：公司地址变更为上海市浦东新区100号", "address"),
        ("用户：信用额度提高到80万元", "credit limit"),
        ("用户：付款条件由月结30天调整为月结60天", "payment terms"),
        ("用户：供应商通知M8螺丝的价格涨到0.15元", "price:m8螺丝"),
        ("用户：M8螺丝现在的价格是0.15元", "price:m8螺丝"),
        ("用户：M6 螺丝的价格是0.10元", "price:m6螺丝"),
        # A subject and a number that is not its value: a negation, another verb, a
        # time, a year, a share, a verb for the subject's name, another kind of address.
        ("User: The IBAN is not GB33 BUKB 2020 1555 5555 55.", None),
        ("User: Payment terms were discussed on 5 May.", None),
        ("User: My phone is at 15% battery.", None),
        ("User: My email was answered in 2 days.", None),
        ("用户：电话是下午3点打来的", None),
        ("用户：地址是2019年换的", None),
        ("User: Please email 3 suppliers today.", None),
        ("User: I'll phone 3 customers.", None),
        ("User: It is written in Swift 5.9.", None),
        ("User: My mobile 5G plan is cheap.", None),
        ("User: The IP address is 10.0.0.1.", None),
        ("用户：它的价格是3元", None),
        ("用户：总价格是300元", None),
        ("User: All of them cost 3 EUR.", None),
        ("User: We want to reduce translation costs by 20%.", None),
        ("User: The liner might cost 30 EUR.", None),
        ("User: A single ride typically costs 2.50 EUR.", "price:single ride"),
        # Verbs that lead to the value, words that end in -ed or start with "not",
        # a statement before a question, Chinese items with a model number inside.
        ("User: Our support email is notifications@acme.com.", "email of ours"),
        ("User: My email is ted@acme.com.", "email of ours"),
        ("User: Our address is Nottingham Road 12.", "address of ours"),
        ("User: The delivery address is Red Lion Street 5.", "address"),
        ("User: The price of the M8 bolts is fixed at 0.12 EUR.", "price:m8 bolt"),
        ("User: Our warehouse address is located at 12 Harbour Road.", "address of ours"),
        ("User: Our phone number is listed as 555-0100.", "phone of ours"),
        ("User: Our IBAN is registered as GB33 BUKB 2020 1555 5555 55.", "iban of ours"),
        (
            'User: The supplier wrote "the price of M8 bolts is 0.15 EUR." Can you order?',
            "price:m8 bolt",
        ),
        (
            "User: **Our IBAN is now GB33 BUKB 2020 1555 5555 55.** Could you update it?",
            "iban of ours",
        ),
        ("User: Supplier says M8 bolts now cost 0.15 EUR.", "price:m8 bolt"),
        ("用户：邮箱地址：jane@acme.com", "email"),
        ("用户：不锈钢M8螺丝的价格是0.2元", "price:不锈钢m8螺丝"),
        ("用户：彩色A4纸的价格是35元", "price:彩色a4纸"),
        ("用户：小米14的价格是3999元", "price:小米14"),
        ("用户：通知书打印的价格是1元", "price:通知书打印"),
        ("User: My e-mail is Jane.Doe@Acme.com.", "email of ours"),
        ("用户：邮箱是Zhang.Wei@example.com", "email"),
        ("User: The price of M8 bolts was increased by 0.03 EUR.", "price:m8 bolt"),
        ("User: The TPS reports cost 5 EUR each.", "price:tps report"),
        ("用户：最近大米的价格是5元。", "price:大米"),
        ("用户：采购的大米单价是5元。", "price:大米"),
        ("User: The payment terms were discussed yesterday at 3 pm.", None),
        ("User: The credit limit was reviewed last week, 3 changes were proposed.", None),
        ("User: The address was confirmed yesterday by 2 managers.", None),
        ("User: The price of the M8 bolts was mentioned twice in 2 meetings.", None),
        # Whose it is, when the sentence names an owner; ourselves; a time or a "which"
        # names nobody; somebody not known (a pronoun, a role) gives no subject.
        ("User: ACME's IBAN is GB33 BUKB 2020 1555 5555 55.", "iban of acme"),
        ("User: Globex’s new IBAN is DE89 3704 0044.", "iban of globex"),
        ("User: Payment terms with ACME are net 60 days.", "payment terms of acme"),
        ("User: The address of the warehouse is 12 Harbour Road.", "address of warehouse"),
        ("User: Mr. Wang's phone number is 555-0100.", "phone of wang"),
        ("User: Our supplier ACME's bank IBAN is GB33 BUKB 2020.", "iban of acme"),
        ("User: Let's note ACME's IBAN is DE89 3704 0044.", "iban of acme"),
        ("User: Remember ACME's IBAN is now DE12 5001 0517.", "iban of acme"),
        ("User: ACME's UK IBAN is GB12 3456 7890.", "iban of acme"),
        ("User: Globex Corp's IBAN is DE89 3704 0044.", "iban of globex corp"),
        ("User: Müller's phone number is 555-0100.", "phone of müller"),
        ("User: Möller's phone number is 555-0199.", "phone of möller"),
        ("User: The payment terms for this order are net 30.", None),
        ("User: The address for deliveries is 5 Mill Lane.", None),
        ("User: The address for invoices is 7 Mill Lane.", None),
        ("User: ACME IBAN: DE89 3704 0044.", "iban of acme"),
        ("User: For ACME, the IBAN is DE89 3704 0044.", "iban of acme"),
        ("User: EUR IBAN: DE89 3704 0044.", "iban"),
        ("User: Our ACME account number is 9999 0000.", None),
        ("User: Your IBAN is GB33 BUKB 2020.", None),
        ("User: Payment terms with ACME since January are net 45 days.", "payment terms of acme"),
        ("User: Q3's price of M8 bolts is 0.12 EUR.", "price:m8 bolt"),
        ("User: Payment terms for us are net 30.", "payment terms of ours"),
        ("User: The company's address is 5 Mill Lane.", "address of ours"),
        ("User: It's IBAN is GB33 BUKB 2020.", "iban"),
        ("User: Today's price of M8 bolts is 0.12 EUR.", "price:m8 bolt"),
        ("User: Their IBAN is GB33 BUKB 2020.", None),
        ("User: The supplier's IBAN is FR76 3000 6000.", None),
        ("用户：ACME的IBAN是GB33 BUKB 2020", "iban of acme"),
        ("用户：和ACME的付款条件是月结30天", "payment terms of acme"),
        ("用户：供应商ACME的付款条件改为月结60天", "payment terms of acme"),
        ("用户：我们和ACME签的付款条件是月结30天", "payment terms of acme"),
        ("用户：ACME给我们的付款条件是月结30天", "payment terms of acme"),
        ("用户：ACME最新的付款条件是月结30天", "payment terms of acme"),
        ("用户：张经理的电话是13800138000", "phone of 张经理"),
        ("用户：华东仓库的收货地址是上海市浦东新区100号", "address of 华东仓库"),
        ("用户：我们公司的收货地址是北京市朝阳区建国路88号", "address of ours"),
        ("用户：我方的IBAN是GB33 BUKB 2020", "iban of ours"),
        ("用户：上个月的付款条件是月结30天", "payment terms"),
        ("用户：合同约定的付款条件是月结30天", "payment terms"),
        ("用户：他们的电话是13800138000", None),
        ("用户：对方的IBAN是GB33 BUKB 2020", None),
        ("用户：老王的电话是13800138000", None),
        ("用户：华为公司的地址是深圳市100号", "address of 华为公司"),
        ("用户：我妈的电话是13900139000", None),
        ("用户：2024年的付款条件是月结30天", "payment terms"),
        ("用户：3月份的付款条件是月结30天", "payment terms"),
        ("用户：调整后的付款条件是月结60天", "payment terms"),
        # A number or a word that only ends like a time is part of a name.
        ("用户：1号仓库的地址是上海市浦东新区世纪大道100号", "address of 1号仓库"),
        ("用户：ACME股份的账号是6222 0000 1111", "account number of acme"),
        ("用户：售后的电话是13800138000", None),
        # A role or a label in capitals is no name; a lead-in without a capital names nobody.
        ("User: ACME sent: SUPPLIER IBAN: DE89 3704 0099", None),
        ("User: ACME BILLING ADDRESS: 12 Main Street, Springfield", "address of acme"),
        ("User: For the record, the IBAN is DE89 3704 0099.", "iban"),
        ("User: For Reference, the IBAN is DE89 3704 0099.", "iban"),
        ("User: With immediate effect, the IBAN is DE89 3704 0099.", "iban"),
        ("User: For our supplier ACME, the IBAN is DE89 3704 0099.", "iban of acme"),
        # A name that is addressed, or a note's prefix, owns nothing.
        ("User: Email ACME the new IBAN: GB33 BUKB 2020 1555 5555 55.", "iban"),
        ("User: PS the IBAN is GB33 BUKB 2020 1555 5555 55.", "iban"),
        ("User: HSBC UK IBAN: GB33 BUKB 2020 1555 5555 55.", "iban of hsbc"),
        ("用户：1号门店的地址是广州市天河区体育西路1号", "address of 1号门店"),
    ],
)
def test_subjects_are_found_in_english_and_chinese(text: str, subject: str | None) -> None:
    assert subject_of(text) == subject


@pytest.mark.parametrize(
    "text",
    [
        "1" + "-1" * 1999,
        "1 " + "a-" * 2000,
        "User: " + "m8 " * 1300 + "price is 3",
        "地址从" * 1300,
    ],
)
def test_subject_rules_take_linear_time_on_hostile_text(text: str) -> None:
    started = time.thread_time()
    subject_of(text)
    assert time.thread_time() - started < 0.1  # 0.4 s before the item words were possessive


# -- raw mode: recency by subject ----------------------------------------------------------

CASES = {
    "en-price": (
        "Please note: the price of the M8 bolts is 0.12 EUR per piece for all orders this quarter.",
        "Update from the supplier: M8 bolt price went up to 0.15 EUR.",
        "What is the price of the M8 bolts per piece for orders this quarter?",
    ),
    "en-iban": (
        "For all supplier invoices our IBAN is DE89 3704 0044 0532 0130 00, please use it.",
        "We moved banks: IBAN GB33 BUKB 2020 1555 5555 55.",
        "Which IBAN do we use for supplier invoices?",
    ),
    "zh-price": (
        "请记住：M8螺丝的价格是每个0.12元，本季度所有订单都适用。",
        "供应商通知：我们把M8螺丝的价格改为0.15元。",
        "本季度所有订单M8螺丝每个的价格是多少？",
    ),
    "zh-address": (
        "我们公司的收货地址是北京市朝阳区建国路88号，所有订单都寄到这里。",
        "收货地址改为上海市浦东新区世纪大道100号。",
        "所有订单寄到我们公司的收货地址是哪里？",
    ),
    "en-cost": (
        "Please note: M8 bolts cost 0.12 EUR per piece for all orders this quarter.",
        "Update from the supplier: M8 bolts now cost 0.15 EUR.",
        "How much do M8 bolts cost per piece for orders this quarter?",
    ),
    "zh-terms": (
        "和ACME的付款条件是月结30天，所有采购订单都按这个结算。",
        "付款条件从月结30天改为月结60天。",
        "ACME所有采购订单的付款条件是什么？",
    ),
    "zh-iban": (
        "供应商发票请付到我们的IBAN：DE89 3704 0044 0532 0130 00，一直有效。",
        "我们换了银行，新的IBAN是GB33 BUKB 2020 1555 5555 55。",
        "供应商发票付到我们的哪个IBAN？",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_newer_value_ranks_first_and_the_older_is_kept_marked_with_its_provenance(
    make_memory: MakeMemory, backup: MySQLBackup, case: str
) -> None:
    old_text, new_text, question = CASES[case]
    memory = make_memory()
    tell(backup, memory, "s1", old_text, "2023-05-01")
    tell(backup, memory, "s2", new_text, "2023-06-01")
    tell(backup, memory, "s2", "Thanks, that is all for today.", "2023-06-01")
    memory.run_pending()

    rows = rows_by_text(backup)
    old, new = (
        rows[next(k for k in rows if old_text in k)],
        rows[next(k for k in rows if new_text in k)],
    )
    assert new.subject is not None and family_of(new.subject) == family_of(old.subject)
    # Nothing merged or deleted: the old memory keeps its text, session, turn and date.
    assert len(rows) == 3
    assert old.superseded_by == new.id and new.superseded_by is None
    assert (old.session_id, old.turn_at) == ("s1", datetime(2023, 5, 1))
    assert old.source_ids == f"[{', '.join(map(str, turn_ids(backup, 's1')[0]))}]"

    # The question is closer to the old wording, and the newer value still comes first.
    found = memory.search(question, user_id="u1", scope="user", k=3)
    texts = [doc.page_content for doc in found]
    first = next(i for i, t in enumerate(texts) if new_text in t)
    later = next(i for i, t in enumerate(texts) if old_text in t)
    assert first < later, texts
    assert found[later].metadata["superseded_by"] == new.id
    assert found[first].metadata["superseded_by"] is None
    assert found[later].metadata["source_ids"] == turn_ids(backup, "s1")[0]
    # The first session alone holds only the old value (its successor is out of scope).
    [alone] = memory.search(question, session_id="s1", k=3)
    assert old_text in alone.page_content and alone.metadata["superseded_by"] == new.id
    # Asked about a time before the change, the old value is the answer.
    [before] = memory.search(question, user_id="u1", scope="user", k=3, until="2023-05-31")
    assert old_text in before.page_content


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (
            "Our IBAN is DE89 3704 0044 0532 0130 00.",
            "Correction: our IBAN is GB33 BUKB 2020 1555 5555 55.",
        ),
        ("收货地址是北京市朝阳区建国路88号。", "收货地址改为上海市浦东新区世纪大道100号。"),
    ],
)
@pytest.mark.parametrize("dated", [False, True])
def test_a_value_stated_twice_at_the_same_time_ends_with_the_last_one_standing(
    make_memory: MakeMemory, backup: MySQLBackup, first: str, second: str, dated: bool
) -> None:
    """One call with both turns (or one session date for both): the later turn stands."""
    memory = make_memory()
    extra = {SESSION_DATE_KEY: "2:10 pm on 8 October, 2023"} if dated else {}
    chat = TieredChatMessageHistory("s1", user_id="u1", backup=backup, long_memory=memory)
    chat.add_messages(
        [
            HumanMessage(first, additional_kwargs=extra),
            AIMessage("Noted."),
            HumanMessage(second, additional_kwargs=extra),
            AIMessage("Noted."),
        ]
    )
    memory.run_pending()
    rows = rows_by_text(backup)
    old = rows[next(k for k in rows if first in k)]
    new = rows[next(k for k in rows if second in k)]
    assert old.turn_at == new.turn_at
    assert (old.superseded_by, new.superseded_by) == (new.id, None)  # never each other
    found = memory.search(first, session_id="s1", k=2)
    assert [second in doc.page_content for doc in found] == [True, False]


def test_a_sentence_that_only_mentions_a_subject_does_not_bury_its_value(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    tell(backup, memory, "s1", "My phone number is 555-0100.")
    tell(backup, memory, "s1", "My phone battery died after 2 hours.")
    memory.run_pending()
    rows = rows_by_text(backup)
    assert all(row.superseded_by is None for row in rows.values())
    [first, *_] = memory.search("What is my phone number?", session_id="s1", k=2)
    assert "555-0100" in first.page_content


def test_a_session_imported_out_of_order_is_superseded_by_the_newer_one(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    for session_id, text, when in (
        ("june", "Payment terms with ACME are now net 60 days.", "2023-06-01"),
        ("may", "Payment terms with ACME are net 30 days.", "2023-05-01"),  # imported later
    ):
        tell(backup, memory, session_id, text, when)
        memory.run_pending()  # one after the other
    rows = rows_by_text(backup)
    june = rows["User: Payment terms with ACME are now net 60 days."]
    may = rows["User: Payment terms with ACME are net 30 days."]
    assert may.superseded_by == june.id and june.superseded_by is None
    found = memory.search("payment terms with ACME net days", user_id="u1", scope="user", k=2)
    assert "net 60" in found[0].page_content


def test_forgetting_the_value_that_stands_hands_the_link_on_or_lets_the_older_stand(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    for session_id, net, when in (
        ("april", 15, "2023-04-01"),
        ("may", 30, "2023-05-01"),
        ("june", 60, "2023-06-01"),
    ):
        tell(backup, memory, session_id, f"Payment terms with ACME are net {net} days.", when)
        memory.run_pending()

    def link(net: int) -> str | None:
        row = rows_by_text(backup)[f"User: Payment terms with ACME are net {net} days."]
        return row.superseded_by

    memory.forget(session_id="may")  # the middle one: april now points past it
    june_id = rows_by_text(backup)["User: Payment terms with ACME are net 60 days."].id
    assert link(15) == june_id
    memory.forget(session_id="june")  # the one that stood: april stands again
    assert link(15) is None
    tell(backup, memory, "july", "Payment terms with ACME are net 45 days.", "2023-07-01")
    memory.run_pending()
    assert link(15) == rows_by_text(backup)["User: Payment terms with ACME are net 45 days."].id


def test_other_users_other_subjects_and_questions_are_left_alone(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    tell(backup, memory, "a1", "The price of the M8 bolts is 0.12 EUR.", "2023-05-01")
    tell(backup, memory, "a1", "Our address is 12 Harbour Road, Leeds.", "2023-05-01")
    tell(backup, memory, "b1", "The price of the M8 bolts is 0.20 EUR.", "2023-06-01", "u2")
    tell(backup, memory, "a2", "What is the price of the M8 bolts?", "2023-06-02")
    # Sessions without a user supersede within their session only.
    tell(backup, memory, "x", "Our IBAN is DE89 3704 0044.", "2023-05-01", None)
    tell(backup, memory, "y", "Our IBAN is GB33 BUKB 2020.", "2023-06-01", None)
    tell(backup, memory, "y", "Correction: our IBAN is GB33 BUKB 9999.", "2023-06-02", None)
    memory.run_pending()

    rows = rows_by_text(backup)
    assert all(
        row.superseded_by is None for text, row in rows.items() if "GB33 BUKB 2020" not in text
    ), {text: row.superseded_by for text, row in rows.items()}
    assert (
        rows["User: Our IBAN is GB33 BUKB 2020."].superseded_by
        == rows["User: Correction: our IBAN is GB33 BUKB 9999."].id
    )


@pytest.mark.parametrize(
    ("acme", "globex", "ours", "acme_again", "nobody_named"),
    [
        (
            "ACME's IBAN is DE89 3704 0044.",
            "Globex's IBAN is FR76 3000 6000.",
            "Our IBAN is GB33 BUKB 2020.",
            "ACME's IBAN is now DE12 5001 0517.",
            "The IBAN is now NL91 ABNA 0417.",
        ),
        (
            "ACME的IBAN是DE89 3704 0044。",
            "Globex的IBAN是FR76 3000 6000。",
            "我们的IBAN是GB33 BUKB 2020。",
            "ACME的IBAN改为DE12 5001 0517。",
            "IBAN改为NL91 ABNA 0417。",
        ),
    ],
)
def test_a_value_of_one_owner_never_buries_another_owners(
    make_memory: MakeMemory,
    backup: MySQLBackup,
    acme: str,
    globex: str,
    ours: str,
    acme_again: str,
    nobody_named: str,
) -> None:
    memory = make_memory()
    for n, text in enumerate((acme, globex, ours), start=1):
        tell(backup, memory, f"s{n}", text, f"2023-05-0{n}")
    memory.run_pending()

    def standing() -> dict[str, str | None]:
        rows = rows_by_text(backup)
        ids = {row.id: text.split(": ", 1)[1] for text, row in rows.items()}
        return {ids[row.id]: ids.get(row.superseded_by or "") for row in rows.values()}

    assert standing() == {acme: None, globex: None, ours: None}
    tell(backup, memory, "s4", acme_again, "2023-06-01")
    memory.run_pending()
    assert standing() == {acme: acme_again, globex: None, ours: None, acme_again: None}
    [first, *_] = memory.search("Globex IBAN", user_id="u1", scope="user", k=3)
    assert globex in first.page_content
    # Nobody named, with several owners in the scope: whose it is is unknown, so it
    # stands beside them and supersedes nothing.
    tell(backup, memory, "s5", nobody_named, "2023-07-01")
    memory.run_pending()
    assert standing() == {
        acme: acme_again,
        globex: None,
        ours: None,
        acme_again: None,
        nobody_named: None,
    }


OWNER_STORIES = {
    "ours stays beside a supplier's": (
        ["ACME's IBAN is DE89 3704 0044.", "Our IBAN is GB33 BUKB 2020."],
        {},
    ),
    "our update leaves the supplier's": (
        [
            "Our IBAN is GB33 BUKB 2020.",
            "ACME's IBAN is DE89 3704 0044.",
            "Our IBAN is now NL91 ABNA 0417.",
        ],
        {"Our IBAN is GB33 BUKB 2020.": "Our IBAN is now NL91 ABNA 0417."},
    ),
    "nobody named after two owners supersedes nothing": (
        [
            "ACME's IBAN is DE89 3704 0044.",
            "The IBAN is now DE12 5001 0517.",
            "Globex's IBAN is FR76 3000 6000.",
            "The IBAN is now NL91 ABNA 0417.",
        ],
        {"ACME's IBAN is DE89 3704 0044.": "The IBAN is now DE12 5001 0517."},
    ),
    "the owner's newest value supersedes what named nobody": (
        [
            "Payment terms with ACME are net 30 days.",
            "The payment terms are now net 60 days.",
            "Payment terms with ACME are net 90 days.",
        ],
        {
            "Payment terms with ACME are net 30 days.": "The payment terms are now net 60 days.",
            "The payment terms are now net 60 days.": "Payment terms with ACME are net 90 days.",
        },
    ),
    "a lead-in is no part of the owner": (
        ["ACME's IBAN is DE89 3704 0044.", "Remember ACME's IBAN is now DE12 5001 0517."],
        {"ACME's IBAN is DE89 3704 0044.": "Remember ACME's IBAN is now DE12 5001 0517."},
    ),
    "a role is nobody in particular": (
        ["The supplier's IBAN is FR76 3000 6000.", "The supplier's IBAN is DE89 3704 0044."],
        {},
    ),
    "zh: ours stays beside a supplier's": (
        [
            "我们的IBAN是GB33 BUKB 2020。",
            "ACME的IBAN是DE89 3704 0044。",
            "我们的IBAN改为NL91 ABNA 0417。",
        ],
        {"我们的IBAN是GB33 BUKB 2020。": "我们的IBAN改为NL91 ABNA 0417。"},
    ),
    "ours is not buried by a name written in capitals": (
        ["Our IBAN is GB33 BUKB 2020.", "ACME IBAN: DE89 3704 0044."],
        {},
    ),
    "ours is not buried by somebody's we cannot name": (
        ["My phone number is 07700 900123.", "My colleague's phone number is 07700 900456."],
        {},
    ),
    "an order's terms name no owner and block nothing": (
        [
            "ACME's payment terms are net 30 days.",
            "The payment terms for order 123 are net 45 days.",
            "The payment terms are now net 60 days.",
        ],
        {"ACME's payment terms are net 30 days.": "The payment terms are now net 60 days."},
    ),
    "zh: numbered warehouses are two owners": (
        ["1号仓库的地址是上海市浦东新区世纪大道100号。", "2号仓库的地址是北京市朝阳区建国路88号。"],
        {},
    ),
    "zh: a company's full name is its name": (
        ["Globex的账号是6222 0000 2222。", "ACME股份的账号是6222 0000 1111。"],
        {},
    ),
    "a label in capitals is nobody's": (
        [
            "ACME's IBAN is DE89 3704 0044.",
            "Globex's IBAN is FR76 3000 6000.",
            "ACME sent: SUPPLIER IBAN: DE89 3704 0099",
            "Globex sent: SUPPLIER IBAN: FR76 3000 6099",
        ],
        {},
    ),
    "capitals with a plain word between": (
        [
            "ACME BILLING ADDRESS: 12 Main Street, Springfield",
            "GLOBEX BILLING ADDRESS: 14 Main Street, Springfield",
        ],
        {},
    ),
    "a lead-in names nobody once two owners are named": (
        [
            "ACME's IBAN is DE89 3704 0044.",
            "Globex's IBAN is FR76 3000 6000.",
            "ACME called. For the record, the IBAN is DE89 3704 0099.",
            "Globex called. For the record, the IBAN is FR76 3000 6099.",
        ],
        {},
    ),
    "a name that is addressed is not the owner": (
        [
            "Our IBAN is GB11 NWBK 6016 1331 9268 19.",
            "ACME's IBAN is DE89 3704 0044 0532 0130 00.",
            "Email ACME the new IBAN: GB33 BUKB 2020 1555 5555 55.",
        ],
        {},
    ),
    "zh: a store and a warehouse of the same number are two owners": (
        [
            "ACME的地址是上海市浦东新区100号。",
            "1号仓库的地址是北京市朝阳区建国路88号。",
            "1号门店的地址是广州市天河区体育西路1号。",
        ],
        {},
    ),
    "zh: a family member is not us": (
        ["我的电话是13800138000。", "我妈的电话是13900139000。"],
        {},
    ),
    "zh: a verb after the name": (
        ["我们和ACME签的付款条件是月结30天。", "ACME给我们的付款条件改为月结60天。"],
        {"我们和ACME签的付款条件是月结30天。": "ACME给我们的付款条件改为月结60天。"},
    ),
}


def answer_a_move(prompt: str) -> str:
    """An extractor that answers "We moved" with an UPDATE of the IBAN and the address."""
    offered = re.findall(r"^\[([^\]]+)\] (.*)$", prompt, re.MULTILINE)
    said = prompt.rsplit("User: ", 1)[-1].split("\n")[0]
    if "moved" not in said:
        return said
    ids = {("iban" if "IBAN" in text else "address"): memory_id for memory_id, text in offered}
    return (
        f"UPDATE [{ids['iban']}]: Our IBAN is GB99 BUKB 2020.\n"
        f"UPDATE [{ids['address']}]: Our address is 2 New Road."
    )


def tell_each_a_day_apart(backup: MySQLBackup, memory: ChromaLongMemory, texts: list[str]) -> None:
    """Each text in a session of its own (s1, s2, ...), a day apart, each extracted."""
    for n, text in enumerate(texts, start=1):
        tell(backup, memory, f"s{n}", text, f"2023-05-{n:02d}")
        memory.run_pending()


@pytest.mark.parametrize("story", list(OWNER_STORIES))
def test_whose_value_it_is_decides_what_it_supersedes(
    make_memory: MakeMemory, backup: MySQLBackup, story: str
) -> None:
    """Each statement in its own session, a day apart; what each older one is superseded by."""
    texts, superseded = OWNER_STORIES[story]
    tell_each_a_day_apart(backup, make_memory(), texts)
    assert superseded_by(backup) == superseded


def test_what_supersedes_what_does_not_depend_on_how_turns_are_batched(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()  # one run for the three: the same as one run after each
    tell(backup, memory, "s1", "Payment terms with ACME are net 30 days.", "2023-05-01")
    tell(backup, memory, "s2", "The payment terms are now net 60 days.", "2023-05-02")
    tell(backup, memory, "s3", "Payment terms with Globex are net 45 days.", "2023-05-03")
    memory.run_pending()
    rows = rows_by_text(backup)
    assert (
        rows["User: Payment terms with ACME are net 30 days."].superseded_by
        == rows["User: The payment terms are now net 60 days."].id
    )
    assert rows["User: Payment terms with Globex are net 45 days."].superseded_by is None


def test_a_value_imported_out_of_order_is_not_buried_by_another_owners(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    tell(backup, memory, "july", "Our IBAN is now NL91 ABNA 0417.", "2023-07-01")
    memory.run_pending()
    tell(backup, memory, "may", "ACME's IBAN is DE89 3704 0044.", "2023-05-01")  # later
    memory.run_pending()
    assert all(row.superseded_by is None for row in catalog(backup))


def test_an_older_archive_gains_the_columns_and_their_indexes(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    memory = make_memory()
    tell(backup, memory, "s1", "Our IBAN is DE89 3704 0044.", "2023-05-01")
    memory.run_pending()
    table = backup.tables.memories
    new_indexes = [i for i in table.indexes if {"subject", "superseded_by"} & set(i.columns.keys())]
    with backup.engine.begin() as conn:
        for index in new_indexes:
            index.drop(conn)
        for column in ("subject", "superseded_by"):
            conn.exec_driver_sql(f"ALTER TABLE {table.name} DROP COLUMN {column}")
    reopened = MySQLBackup(
        backup.url.render_as_string(hide_password=False), table_name=backup.table.name
    )
    try:
        inspector = sa.inspect(reopened.engine)
        assert {"subject", "superseded_by"} <= {
            c["name"] for c in inspector.get_columns(table.name)
        }
        assert {i.name for i in new_indexes} <= {
            i["name"] for i in inspector.get_indexes(table.name)
        }
        upgraded = make_memory(backup=reopened)
        tell(reopened, upgraded, "s2", "Our IBAN is now GB33 BUKB 2020.", "2023-06-01")
        upgraded.run_pending()
        rows = rows_by_text(reopened)
        # The old row has no subject (written before): kept, not superseded, found.
        assert rows["User: Our IBAN is DE89 3704 0044."].subject is None
        assert rows["User: Our IBAN is now GB33 BUKB 2020."].subject == "iban of ours"
        found = upgraded.search("IBAN", user_id="u1", scope="user", k=5)
        assert len(found) == 2
    finally:
        reopened.dispose()


# -- with an extractor: UPDATE <id> -----------------------------------------------------

_OFFERED = re.compile(r"^\[([^\]]+)\] ", re.MULTILINE)


class PromptedExtractor(RecordingChatModel):
    """A fake extractor whose answer is computed from the prompt it is sent."""

    respond: Any = None

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.prompts.append(list(messages))
        answer = self.respond(str(messages[-1].content))
        return ChatResult(generations=[ChatGeneration(message=AIMessage(answer))])


def extractor(respond: Callable[[str], str]) -> PromptedExtractor:
    return PromptedExtractor(messages=replies(), respond=respond)


@pytest.mark.parametrize(
    ("first", "second", "update", "heading"),
    [
        (
            "ACME's contact person is Alice Smith.",
            "ACME told us Bob Jones replaces Alice.",
            "ACME's contact person is Bob Jones.",
            "Existing memories",
        ),
        ("ACME的联系人是张伟。", "ACME说李娜接替张伟。", "ACME的联系人是李娜。", "已有的记忆"),
    ],
)
def test_the_extractor_is_offered_the_nearest_memories_and_may_update_one(
    make_memory: MakeMemory,
    backup: MySQLBackup,
    first: str,
    second: str,
    update: str,
    heading: str,
) -> None:
    def respond(prompt: str) -> str:
        offered = _OFFERED.findall(prompt)
        return f"UPDATE {offered[0]}: {update}" if offered else f"Summary: {first}"

    llm = extractor(respond)
    memory = make_memory(extractor=llm)
    tell(backup, memory, "s1", first)
    memory.run_pending()
    tell(backup, memory, "s2", second)
    memory.run_pending()

    first_prompt, second_prompt = (str(p[-1].content) for p in llm.prompts)
    assert heading not in first_prompt  # nothing to update yet: the plain prompt
    [old] = catalog(backup, "s1")
    assert f"[{old.id}] Summary: {first}" in second_prompt and heading in second_prompt
    [new] = catalog(backup, "s2")
    assert new.text == update and new.kind == "extracted"
    old = catalog(backup, "s1")[0]
    assert old.text == f"Summary: {first}" and old.superseded_by == new.id  # kept, marked
    found = memory.search(first, user_id="u1", scope="user", k=2)
    assert [doc.page_content for doc in found] == [update, f"Summary: {first}"]


def test_an_id_that_was_not_offered_is_never_applied(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    """Another user's id, another session's, a made-up one, SQL: each is a new memory."""
    plain = extractor(lambda prompt: "Summary: " + prompt.rsplit("User: ", 1)[-1].split("\n")[0])
    seeding = make_memory(extractor=plain)
    tell(backup, seeding, "mine", "Our courier is DHL.")
    tell(backup, seeding, "theirs", "Our courier is UPS.", user_id="u2")
    tell(backup, seeding, "loose", "Our courier is FedEx.", user_id=None)
    seeding.run_pending()
    ids = {row.session_id: row.id for row in catalog(backup)}
    hostile = [
        f"UPDATE {ids['theirs']}: courier changed to GLS",
        f"UPDATE {ids['loose']}: courier changed to TNT",
        "UPDATE ffffffffffffffffffffffffffffffff: courier changed to DPD",
        f"UPDATE {ids['mine']}' OR '1'='1: courier changed to Hermes",
        "UPDATE 1;DROP TABLE memories;--: courier changed to Royal Mail",
        f"UPDATE {ids['mine']}--: courier changed to Aramex",
    ]
    answers = iter(hostile)
    memory = make_memory(extractor=extractor(lambda prompt: next(answers)))
    for n in range(len(hostile)):
        tell(backup, memory, f"attack-{n}", f"Courier question number {n}.")
        memory.run_pending()

    rows = catalog(backup)
    assert all(row.superseded_by is None for row in rows)  # nothing was marked
    stored = {row.text for row in rows if row.session_id.startswith("attack-")}
    assert stored == {
        "courier changed to GLS",
        "courier changed to TNT",
        "courier changed to DPD",
        # Not an update line at all: stored as the extractor wrote it.
        f"UPDATE {ids['mine']}' OR '1'='1: courier changed to Hermes",
        "UPDATE 1;DROP TABLE memories;--: courier changed to Royal Mail",
        "courier changed to Aramex",
    }
    # The other scopes' memories are as they were.
    assert {row.session_id: row.text for row in rows if row.session_id in ids} == {
        "mine": "Summary: Our courier is DHL.",
        "theirs": "Summary: Our courier is UPS.",
        "loose": "Summary: Our courier is FedEx.",
    }


def test_parse_update_applies_only_an_offered_id() -> None:
    offered = {"a" * 32}
    assert parse_update(f"UPDATE {'a' * 32}: net 60", offered) == ("net 60", ("a" * 32,))
    assert parse_update(f"update [{'a' * 32}]： 月结60天", offered) == ("月结60天", ("a" * 32,))
    assert parse_update(f"UPDATE {'b' * 32}: net 60", offered) == ("net 60", ())
    assert parse_update("net 60 days", offered) == ("net 60 days", ())


@pytest.mark.parametrize(
    "answer",
    [
        "UPDATE {id}: net 60",
        "**UPDATE {id}**: net 60",
        "`UPDATE {id}: net 60`",
        "UPDATE <{id}>: net 60",
        "UPDATE memory {id}: net 60",
        "UPDATE id {id}: net 60",
        "UPDATE #{id}: net 60",
        "UPDATE {id} - net 60",
        "UPDATE {id} -> net 60",
        "UPDATE {id}\nnet 60",
        "update {id}: net 60",
        "- UPDATE {id}: net 60",
        "1. UPDATE {id}: net 60",
        "### UPDATE {id}: net 60",
        "UPDATE [{id}] net 60",  # as the prompt lists the memories
        "UPDATE {id} → net 60",
        "UPDATE {id} => net 60",
        "UPDATE【{id}】：net 60",
        "UPDATE({id}): net 60",
        "UPDATE [memory {id}]: net 60",
        "UPDATE [id: {id}]: net 60",
        "更新 [{id}]：net 60",
        "**UPDATE [{id}]:** net 60",
        "UPDATE `{id}`: `net 60`",
        "UPDATE {id}. net 60",
        "UPDATE {id}, net 60",
        "UPDATE {id}; net 60",
        "UPDATE: {id}: net 60",
    ],
)
def test_an_update_in_the_forms_models_write_is_applied(answer: str) -> None:
    memory_id = "0f" * 16
    assert parse_update(answer.format(id=memory_id), {memory_id}) == ("net 60", (memory_id,))


def test_an_update_of_a_name_not_offered_keeps_the_name() -> None:
    # "UPDATE ACME:" names what changed: kept whole; a made-up id is dropped.
    offered = {"0f" * 16}
    text = "UPDATE ACME: the IBAN is now GB33"
    assert parse_update(text, offered) == (text, ())
    assert parse_update("UPDATE deadbeef42: net 60", offered) == ("net 60", ())


def test_an_offered_id_is_applied_whatever_its_case() -> None:
    memory_id = "0f" * 16
    assert parse_update(f"UPDATE {memory_id.upper()}: net 60", {memory_id}) == (
        "net 60",
        (memory_id,),
    )


@pytest.mark.parametrize(
    "text",
    [
        "Update pricing: net 60",
        "Update: the meeting moved to 5 pm",
        "Update #4711: order shipped on 5 May, tracking 1Z999.",
        "Update 1:56 pm - the user arrived",
        "Update Q3: revenue is up",
        "更新 付款条件：月结60天",
        "UPDATE: the meeting moved to 5 pm",
        "UPDATE the team. All good",
    ],
)
def test_a_summary_that_starts_with_update_is_kept_whole(text: str) -> None:
    assert parse_update(text, {"0f" * 16}) == (text, ())


def test_parse_update_takes_linear_time_on_hostile_answers() -> None:
    # Heads of 2,000 characters (what is read of an answer) that fit no form: quadratic
    # backtracking took ~30 ms each, 101 s for 100,000 characters.
    heads = [f"UPDATE {fill * 2_000}" for fill in ("*", " ", "`", "[", "'", "*`", ":", ".")]
    heads += [f"UPDATE id{' ' * 2_000}", f"- UPDATE memory {'#' * 2_000}"]
    started = time.thread_time()
    for head in heads:
        parse_update(head, {"0f" * 16})
    assert time.thread_time() - started < 0.05


@pytest.mark.parametrize("answer", ["UPDATE {id}:", "**UPDATE {id}**: **", "UPDATE [{id}]：  "])
def test_an_update_without_its_new_text_is_a_failed_attempt(answer: str) -> None:
    memory_id = "0f" * 16
    with pytest.raises(ValueError, match="without the new text"):
        parse_update(answer.format(id=memory_id), {memory_id})


def test_an_answer_may_update_several_memories_a_line_each() -> None:
    first, second, third = "0f" * 16, "ab" * 16, "cd" * 16
    offered = {first, second, third}
    answer = (
        "The supplier changed two things.\n"
        f"- UPDATE [{first}]: Payment terms with ACME are net 60.\n"
        f"- UPDATE [{second}]: ACME's IBAN is GB33 BUKB 2020 1555 5555 55.\n"
        f"- UPDATE [{first}]: Payment terms with ACME are net 60 from May.\n"
        f"UPDATE {'ef' * 16}: a made-up id keeps its text only\n"
        "UPDATE deadbeef42: a name that is no id of ours, mid-answer, stays as written"
    )
    assert parse_update(answer, offered) == (
        "The supplier changed two things.\n"
        "Payment terms with ACME are net 60.\n"
        "ACME's IBAN is GB33 BUKB 2020 1555 5555 55.\n"
        "Payment terms with ACME are net 60 from May.\n"
        "a made-up id keeps its text only\n"
        "UPDATE deadbeef42: a name that is no id of ours, mid-answer, stays as written",
        (first, second),
    )
    # Chinese, and an update whose new text is NONE (nothing changed about it).
    answer = (
        f"UPDATE {first}：付款条件改为月结60天\nUPDATE {third}: NONE\n更新 [{second}]：IBAN改为GB33"
    )
    assert parse_update(answer, offered) == ("付款条件改为月结60天\nIBAN改为GB33", (first, second))
    assert parse_update(f"UPDATE {first}: NONE\n\nUPDATE {second}: none.", offered) == (None, ())
    with pytest.raises(ValueError, match="without the new text"):
        parse_update(f"UPDATE {first}: net 60\nUPDATE {second}:", offered)


A, B = "0f" * 16, "ab" * 16


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        # Windows and other line ends: an empty update is still a failed attempt
        # (below), and no carriage return is stored.
        (f"UPDATE {A}: price 5\r\nUPDATE {B}: acct 7", ("price 5\nacct 7", (A, B))),
        (f"UPDATE {A}\r\nprice 5", ("price 5", (A,))),
        (f"UPDATE {A}: x\u2028UPDATE {B}: y", ("x\ny", (A, B))),
        # Nothing changed, however it is said; what follows is a summary of its own.
        (
            f"UPDATE {A}: NONE\n\nThe user asked about couriers.",
            ("The user asked about couriers.", ()),
        ),
        (f"UPDATE {A}: NONE (nothing changed)", (None, ())),
        (f"UPDATE {A}: N/A\nUPDATE {B}: unchanged.", (None, ())),
        (f"UPDATE {A}: 无变化。", (None, ())),
        (f"UPDATE {A}: NONE - nothing changed", (None, ())),
        (f"UPDATE {A}: N/A — no update needed", (None, ())),
        (f"UPDATE {A}: No update needed.", (None, ())),
        (f"UPDATE {A}: Same as before", (None, ())),
        (f"UPDATE {A}: 无需更新", (None, ())),
        (f"UPDATE {A}: 没有变化，保持不变", (None, ())),
        (f"UPDATE {A}: -", (None, ())),
        (f"UPDATE {A}: NONE (nothing changed since 2023)", (None, ())),
        (f"UPDATE {A}: Unchanged (still valid as of 5 May)", (None, ())),
        (f"UPDATE {A}: No.", (None, ())),
        (f"UPDATE {A}: No - nothing changed", (None, ())),
        (f"UPDATE {A}: 无（与之前相同）", (None, ())),
        (f"UPDATE {A}: 没有，与之前相同", (None, ())),
        (f"UPDATE {A}: NONE (see above) — nothing new", (None, ())),
        (f"UPDATE {A}: N/A – not relevant to any memory", (None, ())),
        (f"UPDATE {A}: No, this memory is still accurate.", (None, ())),
        (f"UPDATE {A}: 没有，仍然正确。", (None, ())),
        # A line that says nothing changed and then more supersedes nothing: what it
        # says more is kept beside the memory (a misread remark never buries it, nor is
        # a new fact in it lost).
        *(
            (f"UPDATE {A}: {said}", (said, ()))
            for said in (
                "Unchanged (ACME now pays net 60)",
                "N/A (terms now net 60)",
                "NONE (the user mentions the IBAN again, but it is unchanged)",
                "No changes - however, the user may revise this later.",
                "No, use the same IBAN DE89 3704 0044 for all invoices.",
                "No, the delivery address is the same as the billing one: 1 New Road.",
                "No, the terms are no longer the same as before: net 60 days.",
                "Unchanged - except the contact is now Bob Jones.",
                "没有，付款条件与之前不一致，改为月结60天。",
                "No, ACME now pays net sixty.",
                "Unchanged, except the IBAN is now GB33.",
                "None - terms are now net 60.",
                "没有，付款条件改为月结60天",
                "无变化，但联系人换成了李四。",
            )
        ),
        # Marks over a text, or a line whose words go on, state a value.
        (f"UPDATE {A}: ✅\nBob Jones is the contact.", ("✅\nBob Jones is the contact.", (A,))),
        (
            f"UPDATE {A}: None of our suppliers accept cheques.",
            ("None of our suppliers accept cheques.", (A,)),
        ),
        (
            f"UPDATE {A}: No change to terms, but the IBAN is now GB33",
            ("No change to terms, but the IBAN is now GB33", (A,)),
        ),
        (f"UPDATE {A}: 无锡仓库的地址改为X路1号", ("无锡仓库的地址改为X路1号", (A,))),
        # A summary line that merely starts with UPDATE and a name is kept as written.
        ("Patched:\nUPDATE KB5034441: boot fix", ("Patched:\nUPDATE KB5034441: boot fix", ())),
        ("The user ran:\nUPDATE orders_2024\n", ("The user ran:\nUPDATE orders_2024\n", ())),
        (f"UPDATE {A}: net 60\nUPDATE deadbeef42:", ("net 60\nUPDATE deadbeef42:", (A,))),
        # Fences and list markers are markup; the same new text is stored once.
        (f"```text\nUPDATE {A}: NONE\n```", (None, ())),
        (f"+ UPDATE {A}: x\n1、UPDATE {B}: y", ("x\ny", (A, B))),
        (f"(1) UPDATE {A}: x\n\u3000UPDATE {B}: y", ("x\ny", (A, B))),
        (f"UPDATE {A}: x\nUPDATE {B}: x", ("x", (A, B))),
        # A made-up id of our own form, anywhere: refused, its text kept.
        (f"UPDATE {A}: x\nUPDATE {'cd' * 16}: y", ("x\ny", (A,))),
        (f"UPDATE {A}: x\nUPDATE {'cd' * 16}:", ("x", (A,))),
    ],
)
def test_update_answers_as_models_also_write_them(
    answer: str, expected: tuple[str | None, tuple[str, ...]]
) -> None:
    assert parse_update(answer, {A, B}) == expected


@pytest.mark.parametrize("answer", [f"UPDATE {A}:\r\nUPDATE {B}: acct", f"UPDATE {A}: **\r\n"])
def test_an_empty_update_on_windows_line_ends_is_a_failed_attempt(answer: str) -> None:
    with pytest.raises(ValueError, match="without the new text"):
        parse_update(answer, {A, B})


def test_parse_update_takes_linear_time_on_hostile_lines() -> None:
    # Every line start is read: a run of blank lines or of heads that fit no form
    # must not be read again from each line.
    memory_id = "0f" * 16
    texts = [
        "\n" * 100_000,
        "UPDATE\n" * 20_000,
        "- \n" * 50_000,
        f"UPDATE {memory_id}\n" + "*\n" * 50_000,
        "UPDATE " + " \n" * 50_000,
        "> " * 50_000,
        "UPDATE deadbeef42: x\n" * 10_000,
        f"UPDATE {'cd' * 16}: x\n" * 5_000,
        "\r\n" * 50_000,
        "```\n" * 20_000,
    ]
    started = time.thread_time()
    for text in texts:
        with contextlib.suppress(ValueError):  # a head without text
            parse_update(text, {memory_id})
    assert time.thread_time() - started < 0.5


@pytest.mark.parametrize(
    ("first", "second", "question", "changes"),
    [
        (
            "Payment terms with ACME are net 30 days.",
            "ACME's IBAN is DE89 3704 0044 0532 0130 00.",
            "ACME now wants net 60 and paid to GB33 BUKB 2020 1555 5555 55.",
            ("Payment terms with ACME are net 60 days.", "ACME's IBAN is GB33 BUKB 2020."),
        ),
        (
            "和ACME的付款条件是月结30天。",
            "ACME的IBAN是DE89 3704 0044。",
            "ACME改成月结60天，付款到GB33 BUKB 2020。",
            ("和ACME的付款条件是月结60天。", "ACME的IBAN是GB33 BUKB 2020。"),
        ),
    ],
)
def test_one_turn_that_changes_two_memories_supersedes_both(
    make_memory: MakeMemory,
    backup: MySQLBackup,
    first: str,
    second: str,
    question: str,
    changes: tuple[str, str],
) -> None:
    def respond(prompt: str) -> str:
        offered = dict(
            (text.removeprefix("Summary: "), memory_id)
            for memory_id, text in re.findall(r"^\[([^\]]+)\] (.*)$", prompt, re.MULTILINE)
        )
        if len(offered) < 2:
            return "Summary: " + prompt.split("User: ", 1)[-1].split("用户: ", 1)[-1].split("\n")[0]
        pairs = zip((first, second), changes, strict=True)
        lines = [f"UPDATE [{offered[old]}]: {new}" for old, new in pairs]
        return "\n".join([*lines, f"UPDATE [{offered[first]}]: NONE"])

    memory = make_memory(extractor=extractor(respond))
    tell(backup, memory, "s1", first)
    memory.run_pending()
    tell(backup, memory, "s2", second)
    memory.run_pending()
    tell(backup, memory, "s3", question)
    memory.run_pending()

    [one] = catalog(backup, "s1")
    [two] = catalog(backup, "s2")
    [new] = catalog(backup, "s3")
    assert new.text == "\n".join(changes)  # no "UPDATE" or ids in what is stored
    assert one.superseded_by == two.superseded_by == new.id  # both kept, both marked
    assert first in one.text and second in two.text


def test_forgetting_a_memory_of_several_facts_lets_each_older_value_stand_again(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    """A memory that updated an IBAN and an address is superseded for its IBAN only."""

    memory = make_memory(extractor=extractor(answer_a_move))
    tell_each_a_day_apart(
        backup,
        memory,
        [
            "Our IBAN is GB33 BUKB 2020.",
            "Our address is 1 Old Road.",
            "We moved: new bank, new office.",
            "Our IBAN is now DE89 3704 0044.",
        ],
    )
    by_text = {row.text.splitlines()[0]: row for row in catalog(backup)}
    assert (
        by_text["Our address is 1 Old Road."].superseded_by
        == by_text["Our IBAN is GB99 BUKB 2020."].id
    )
    memory.forget(session_id="s3")
    by_text = {row.text.splitlines()[0]: row for row in catalog(backup)}
    assert (
        by_text["Our IBAN is GB33 BUKB 2020."].superseded_by
        == by_text["Our IBAN is now DE89 3704 0044."].id
    )
    assert by_text["Our address is 1 Old Road."].superseded_by is None  # stands again


# Stories of forgetting: the extractor (None: raw turns), the texts a day apart, the
# session forgotten, and what each superseded memory is superseded by afterwards.
FORGET_STORIES: dict[str, tuple[Callable[[str], str] | None, list[str], str, dict[str, str]]] = {
    "a newer value of its subject replaces the value that stands again": (
        answer_a_move,
        [
            "Our IBAN is GB33 BUKB 2020.",
            "Our address is 1 Old Road.",
            "We moved: new bank, new office.",
            "Our address is now 3 Third Street.",
        ],
        "s3",
        {"Our address is 1 Old Road.": "Our address is now 3 Third Street."},
    ),
    "an owner's value comes back to the owner's newest": (
        None,
        [
            "ACME's IBAN is DE89 3704 0044.",
            "The IBAN is now NL91 ABNA 0417.",
            "Globex's IBAN is FR76 3000 6000.",
            "ACME's IBAN is now GB33 BUKB 2020.",
        ],
        "s2",
        {"ACME's IBAN is DE89 3704 0044.": "ACME's IBAN is now GB33 BUKB 2020."},
    ),
}


@pytest.mark.parametrize("story", list(FORGET_STORIES))
def test_a_value_that_stands_again_is_superseded_by_a_newer_one_of_its_subject(
    make_memory: MakeMemory, backup: MySQLBackup, story: str
) -> None:
    """Forgetting the memory that superseded a value lets it stand again only if no newer
    value of its own subject stands."""
    respond, texts, forgotten, superseded = FORGET_STORIES[story]
    memory = make_memory() if respond is None else make_memory(extractor=extractor(respond))
    tell_each_a_day_apart(backup, memory, texts)
    memory.forget(session_id=forgotten)
    assert superseded_by(backup) == superseded


def test_an_archive_forgetting_alone_leaves_no_link_to_a_deleted_memory(
    make_memory: MakeMemory, backup: MySQLBackup, table_name: str
) -> None:
    """An administrator's script opens only the archive: the value its forgotten
    successor superseded stands again instead of pointing at nothing."""
    memory = make_memory()
    tell(backup, memory, "s1", "ACME's IBAN is DE89 3704 0044 0532 0130 00.", "2024-05-01")
    tell(backup, memory, "s2", "ACME's IBAN is now GB33 BUKB 2020 1555 5555 55.", "2024-05-02")
    memory.run_pending()
    memory.close()
    admin = MySQLBackup(backup.url, table_name=table_name)
    try:
        admin.forget(session_id="s2", user_id="u1")
    finally:
        admin.dispose()
    rows = catalog(backup)
    assert [row.text.splitlines()[0] for row in rows] == [
        "User: ACME's IBAN is DE89 3704 0044 0532 0130 00."
    ]
    assert rows[0].superseded_by is None


def test_forgetting_reads_each_subject_once_however_many_values_stand_again(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    """Forty suppliers' IBANs, each updated in another session: forgetting that session
    lets forty values stand again with one read of their subject, not forty."""
    memory = make_memory()
    for n in range(40):
        tell(
            backup,
            memory,
            "s1",
            f"Supplier{n:02d}'s IBAN is DE{n + 10} 3704 0044 {n:04d}.",
            "2024-05-01",
        )
    memory.run_pending()
    for n in range(40):
        tell(
            backup,
            memory,
            "s2",
            f"Supplier{n:02d}'s IBAN is now GB{n + 10} BUKB 2020 {n:04d}.",
            "2024-05-02",
        )
    memory.run_pending()
    assert sum(row.superseded_by is not None for row in catalog(backup)) == 40
    reads: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "subject" in statement:
            reads.append(statement)

    sa.event.listen(backup.engine, "before_cursor_execute", count)
    try:
        memory.forget(session_id="s2", user_id="u1")
    finally:
        sa.event.remove(backup.engine, "before_cursor_execute", count)
    assert all(row.superseded_by is None for row in catalog(backup))
    assert len(catalog(backup)) == 40
    assert len(reads) <= 3


def test_a_value_imported_out_of_order_is_linked_in_the_batch_that_updates_its_successor(
    make_memory: MakeMemory, backup: MySQLBackup
) -> None:
    """May's address arrives with July's move, which updates June's: May's is superseded by
    June's, as it would be had it arrived alone."""
    memory = make_memory(extractor=extractor(answer_a_move))
    tell(backup, memory, "june", "Our IBAN is DE89 3704 0044.", "2023-06-01")
    tell(backup, memory, "june", "Our address is 1 Old Road.", "2023-06-01")
    memory.run_pending()
    tell(backup, memory, "may", "Our address is 0 Older Road.", "2023-05-01")
    tell(backup, memory, "july", "We moved.", "2023-07-01")
    memory.run_pending()
    links = superseded_by(backup)
    assert links["Our address is 0 Older Road."] == "Our address is 1 Old Road."
    assert links["Our address is 1 Old Road."].startswith("Our IBAN is GB99")


# Stories of a memory imported out of order whose extractor answers UPDATE of a newer
# one (the memory whose text has the word updates the first one offered): the turns
# after the first (run alone) come in one batch; what supersedes what at the end.
LATE_UPDATES: dict[str, tuple[str, list[tuple[str, str, str]], dict[str, str]]] = {
    "the update wins and the two never supersede each other": (
        "Older",
        [
            ("july", "Our address is 2 New Road.", "2023-07-01"),
            ("may", "Our address is 0 Older Road.", "2023-05-01"),
        ],
        {"Our address is 2 New Road.": "Our address is 0 Older Road."},
    ),
    "no link leads back through a third memory": (
        "May",
        [
            ("july", "Our address is 7 July Road.", "2023-07-01"),
            ("may", "Our address is 5 May Road.", "2023-05-01"),
            ("june", "Our address is 6 June Road.", "2023-06-01"),
        ],
        {
            "Our address is 7 July Road.": "Our address is 5 May Road.",
            "Our address is 5 May Road.": "Our address is 6 June Road.",
        },
    ),
}


@pytest.mark.parametrize("story", list(LATE_UPDATES))
def test_links_never_lead_back_to_where_they_start(
    make_memory: MakeMemory, backup: MySQLBackup, story: str
) -> None:
    word, turns, superseded = LATE_UPDATES[story]

    def respond(prompt: str) -> str:
        said = prompt.rsplit("User: ", 1)[-1].split("\n")[0]
        offered = re.findall(r"^\[([^\]]+)\] (.*)$", prompt, re.MULTILINE)
        return f"UPDATE [{offered[0][0]}]: {said}" if word in said and offered else said

    memory = make_memory(extractor=extractor(respond))
    for n, (session, text, when) in enumerate(turns):
        tell(backup, memory, session, text, when)
        if n == 0:
            memory.run_pending()
    memory.run_pending()
    assert superseded_by(backup) == superseded
