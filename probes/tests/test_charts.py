"""The probe chart's geometry, worked out by hand on the wide layout (plot from x=150, 540
units for 100%), and its texts escaped."""

from __future__ import annotations

import re

from evaluation.charts import WIDE
from probes.charts import KindRow, RunSeries, accuracy_chart, accuracy_svg


def test_it_draws_accuracy_whiskers_and_chance_where_the_numbers_say():
    svg = accuracy_chart(
        [KindRow("night", 50.0), KindRow("count", 25.0)],
        [
            RunSeries(
                "run", {"night": 50.0, "count": 10.0}, {"night": (40.0, 60.0), "count": (5.0, 20.0)}
            )
        ],
        title="t",
        layout=WIDE,
    )
    # Bars start at the plot's left edge: 50% is 270 units wide, 10% is 54.
    assert re.findall(r'<rect x="150" y="[\d.]+" width="([\d.]+)"', svg) == ["270.0", "54.0"]
    # The night whisker from 40% (366) to 60% (474); the count one from 5% (177) to 20% (258).
    whiskers = re.findall(
        r'<line x1="([\d.]+)" y1="([\d.]+)" x2="([\d.]+)" y2="\2" class="whisker"', svg
    )
    assert [(a, b) for a, _, b in whiskers] == [("366.0", "474.0"), ("177.0", "258.0")]
    # Chance: a mark at 50% (420) across night's bar, at 25% (285) across count's.
    chance = re.findall(r'<line x1="([\d.]+)" y1="[\d.]+" x2="\1" y2="[\d.]+" class="chance">', svg)
    assert chance == ["420.0", "285.0"]


def test_a_kind_not_answered_yet_has_no_bar_and_texts_are_escaped():
    svg = accuracy_svg(
        [KindRow("facing", 25.0)],
        [RunSeries("<b>model</b>", {}, {})],
        title="a & b",
    )
    assert '<rect x="150"' not in svg and "<b>" not in svg
    assert "&lt;b&gt;model&lt;/b&gt;" in svg and "a &amp; b" in svg
    # Both layouts, the stylesheet shows one.
    assert svg.count("<svg ") == 2
