"""Deterministic synthetic ERP text for the compression and token benchmarks.

Shared by ``bench_compression`` (150,000-character tool outputs) and ``bench_tokens``
(the mixed ERP sample). Everything depends only on the ``random.Random`` passed in,
so a seed gives the same text on every run and machine.
"""

from __future__ import annotations

import json
import random

CUSTOMERS = (
    "上海华东贸易有限公司",
    "北京中关村科技发展有限公司",
    "深圳前海供应链管理有限公司",
    "广州白云精细化工有限公司",
    "杭州西湖茶业有限公司",
    "成都天府软件股份有限公司",
    "苏州工业园区精密制造有限公司",
    "武汉光谷生物医药有限公司",
    "南京金陵建材有限公司",
    "天津滨海港务集团",
    "重庆山城汽车配件有限公司",
    "青岛蓝海食品有限公司",
    "西安古城文化传媒有限公司",
    "厦门鹭岛电子有限公司",
    "宁波北仑模具厂",
    "长沙岳麓农业科技有限公司",
)
VENDORS = (
    "江苏恒通钢材有限公司",
    "浙江永泰包装材料厂",
    "佛山顺德电器配件有限公司",
    "东莞长安五金制品有限公司",
    "合肥科大讯联网络服务有限公司",
    "郑州中原物流有限公司",
    "昆明滇池办公用品商行",
    "大连星海冷链运输有限公司",
)
AR_STATUS = ("未结清", "已结清", "部分收款", "逾期", "已开票未过账")
AP_STATUS = ("待审批", "已审批", "已付款", "部分付款", "挂起")
MEMOS = (
    "季度框架合同分期开票",
    "含运费与保险",
    "客户要求合并开票",
    "退货冲红后重开",
    "按合同约定30天账期",
    "",
    "",
    "预收款抵扣后余额",
)
TERMS = ("月结30天", "月结60天", "货到付款", "预付30%，尾款验收后付清", "Net 45")

FIELDS = (
    ("ar_invoice", "invoice_no", "VARCHAR(32)", "应收发票号，唯一，格式 AR-年份-流水号"),
    ("ar_invoice", "customer_id", "BIGINT", "客户主键，关联 customer.id"),
    ("ar_invoice", "amount", "DECIMAL(18,2)", "含税金额（人民币）"),
    ("ar_invoice", "tax_amount", "DECIMAL(18,2)", "税额，税率见 tax_code"),
    ("ar_invoice", "due_date", "DATE", "到期日，用于账龄分析"),
    ("ar_invoice", "status", "VARCHAR(16)", "状态：未结清/已结清/部分收款/逾期"),
    ("ar_receipt", "receipt_no", "VARCHAR(32)", "收款单号"),
    ("ar_receipt", "invoice_no", "VARCHAR(32)", "核销的发票号"),
    ("ar_receipt", "received_at", "DATETIME", "到账时间"),
    ("ap_bill", "bill_no", "VARCHAR(32)", "应付账单号，格式 AP-年份-流水号"),
    ("ap_bill", "vendor_id", "BIGINT", "供应商主键，关联 vendor.id"),
    ("ap_bill", "po_no", "VARCHAR(32)", "采购订单号"),
    ("ap_bill", "payment_terms", "VARCHAR(32)", "付款条件，例如 月结30天"),
    ("ap_payment", "payment_no", "VARCHAR(32)", "付款单号"),
    ("gl_entry", "account_code", "VARCHAR(16)", "会计科目编码，1122 应收账款，2202 应付账款"),
    ("customer", "credit_limit", "DECIMAL(18,2)", "信用额度，超额需财务经理审批"),
)
PROSE_ZH = (
    "应收账款模块记录客户发票、收款与核销关系，月末需要与总账 1122 科目对账。",
    "账龄分析按到期日分为 0-30 天、31-60 天、61-90 天和 90 天以上四个区间。",
    "如果收款金额小于发票金额，系统将发票状态更新为部分收款，并保留未核销余额。",
    "应付账单在三单匹配（采购订单、入库单、发票）通过后才能进入付款审批流程。",
    "供应商主数据的变更需要经过采购经理和财务经理两级审批，变更记录保存在审计日志中。",
    "坏账准备按照账龄比例法计提，比例在参数表 ar_bad_debt_rate 中配置。",
    "跨月冲红的发票必须先在总账中反向过账，再重新开具蓝字发票。",
)
PROSE_EN = (
    "The AR module posts every customer invoice to the general ledger when it is approved.",
    "Receipts are matched to open invoices first by invoice number, then by amount and date.",
    "A nightly job recalculates the ageing buckets and flags invoices that passed their due date.",
    "The AP payment run selects approved bills whose due date falls within the next seven days.",
    "Three-way matching compares the purchase order, the goods receipt and the vendor invoice.",
    "Credit holds are released automatically once the outstanding balance drops below the limit.",
    "Exchange-rate differences on foreign-currency invoices are booked to account 6603.",
    "Use the read-only reporting replica for ad-hoc queries; never query the primary directly.",
)


def _date(rng: random.Random) -> str:
    return f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def invoice_row(rng: random.Random) -> str:
    """One AR invoice as a JSON line (Chinese customer names)."""
    amount = round(rng.uniform(100, 500_000), 2)
    return json.dumps(
        {
            "invoice_no": f"AR-2024-{rng.randint(0, 999_999):06d}",
            "customer": rng.choice(CUSTOMERS),
            "customer_code": f"C{rng.randint(1000, 9999)}",
            "amount": amount,
            "tax_amount": round(amount * 0.13 / 1.13, 2),
            "currency": "CNY",
            "invoice_date": _date(rng),
            "due_date": _date(rng),
            "status": rng.choice(AR_STATUS),
            "memo": rng.choice(MEMOS),
        },
        ensure_ascii=False,
    )


def bill_row(rng: random.Random) -> str:
    """One AP bill as a JSON line (Chinese vendor names)."""
    return json.dumps(
        {
            "bill_no": f"AP-2024-{rng.randint(0, 999_999):06d}",
            "vendor": rng.choice(VENDORS),
            "po_no": f"PO{rng.randint(100_000, 999_999)}",
            "amount": round(rng.uniform(50, 300_000), 2),
            "payment_terms": rng.choice(TERMS),
            "bill_date": _date(rng),
            "status": rng.choice(AP_STATUS),
        },
        ensure_ascii=False,
    )


def sql_block(rng: random.Random) -> str:
    """A DDL statement with Chinese column comments, or a report query."""
    if rng.random() < 0.5:
        table = rng.choice(FIELDS)[0]
        columns = [f for f in FIELDS if f[0] == table]
        lines = [f"CREATE TABLE {table} (", "  id BIGINT PRIMARY KEY AUTO_INCREMENT,"]
        lines += [
            f"  {name} {kind} NOT NULL COMMENT '{comment}'," for _, name, kind, comment in columns
        ]
        lines.append("  created_at DATETIME DEFAULT CURRENT_TIMESTAMP")
        lines.append(f") ENGINE=InnoDB COMMENT='{rng.choice(PROSE_ZH)[:12]}';")
        return "\n".join(lines)
    days = rng.choice((30, 60, 90, 180))
    return (
        "SELECT c.name AS 客户名称, SUM(i.amount) AS 未收金额, COUNT(*) AS 发票数\n"
        "FROM ar_invoice i JOIN customer c ON c.id = i.customer_id\n"
        "WHERE i.status IN ('未结清', '逾期')\n"
        f"  AND i.due_date < CURRENT_DATE - INTERVAL {days} DAY\n"
        f"GROUP BY c.name HAVING SUM(i.amount) > {rng.randint(1, 50) * 1000}\n"
        "ORDER BY 未收金额 DESC LIMIT 50;"
    )


def prose_block(rng: random.Random, zh_share: float = 0.35) -> str:
    """A knowledge-base paragraph: Chinese and English sentences plus a field note."""
    sentences = [
        rng.choice(PROSE_ZH) if rng.random() < zh_share else rng.choice(PROSE_EN)
        for _ in range(rng.randint(3, 6))
    ]
    table, name, kind, comment = rng.choice(FIELDS)
    sentences.append(f"Field {table}.{name} ({kind}): {comment}.")
    return " ".join(sentences)


def field_description(rng: random.Random) -> str:
    """A Chinese data-dictionary line."""
    table, name, kind, comment = rng.choice(FIELDS)
    return f"字段 {table}.{name}，类型 {kind}：{comment}。"


def fill(rng: random.Random, chars: int, make_block: list, header: str = "") -> str:
    """Concatenate blocks from ``make_block`` (functions of ``rng``) up to ``chars``."""
    parts = [header] if header else []
    size = len(header)
    while size < chars:
        block = rng.choice(make_block)(rng)
        parts.append(block)
        size += len(block) + 1
    return "\n".join(parts)[:chars]


def mixed_erp_text(seed: int = 7, chars: int = 50_000) -> str:
    """The mixed sample: Chinese field descriptions, JSON rows and SQL."""
    rng = random.Random(seed)
    blocks = [field_description, field_description, invoice_row, bill_row, sql_block]
    return fill(rng, chars, blocks)
