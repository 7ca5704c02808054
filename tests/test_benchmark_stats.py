from __future__ import annotations

import math
import statistics

import pytest

from benchmarks.stats import percentile


def test_interpolates_between_the_closest_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]  # sorted: 1, 2, 3, 4; rank = pct / 100 * 3
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 95) == pytest.approx(3.85)
    assert percentile(values, 100) == 4.0


def test_agrees_with_the_standard_library() -> None:
    values = [float((i * 37) % 101) for i in range(250)]
    assert percentile(values, 50) == statistics.median(values)
    inclusive = statistics.quantiles(values, n=100, method="inclusive")
    assert percentile(values, 95) == pytest.approx(inclusive[94])
    assert percentile(values, 99) == pytest.approx(inclusive[98])


def test_one_value_and_none() -> None:
    assert percentile([7.0], 95) == 7.0
    assert math.isnan(percentile([], 50))


@pytest.mark.parametrize("pct", [-1, 100.5])
def test_rejects_pct_outside_0_to_100(pct: float) -> None:
    with pytest.raises(ValueError, match=r"within 0\.\.100"):
        percentile([1.0, 2.0], pct)


def test_a_locomo_category_row_carries_its_own_target_and_no_baseline() -> None:
    from benchmarks.bench_recall import Row

    def row(metric: str) -> dict[str, object]:
        measured = Row("LoCoMo dev", "minilm", metric)
        measured.add(0.5, [], 0.01)
        return measured.as_dict()

    overall, multi_hop, temporal = (
        row("recall@10"),
        row("recall@10, multi-hop"),
        row("recall@10, temporal"),
    )
    assert (overall["baseline"], overall["target"]) == (0.60, 0.88)
    assert multi_hop["target"] == 0.65 and "baseline" not in multi_hop
    assert "target" not in temporal and "baseline" not in temporal
