"""What the runs table shows, read in the browser: its width against its box's,
and each text cell from a run (name, group, node, user) as shown and in full.
Shared by the node dashboard's tests and the team server's."""

from __future__ import annotations

from typing import Any

#: One run at realistic lengths: a sweep's name, torchrun's UUID run id, a
#: cluster's host name (the node number sits before the shared domain).
NAME = "llama7b-sft-lr3e-4-bs64-warmup500-seed1"
GROUP = "3f2a9c1e-77b0-4d5e-9a1f-0c2b6e8d4a11"
HOSTS = ("gpu-node-017.cluster.internal", "gpu-node-018.cluster.internal")
USERS = ("jsmith", "jennifer.smith-ml-platform")

#: Per row (by data-run): per text column, the element with the tooltip: its
#: title, its whole text, whether its box cuts it, and the text left showing.
_CELLS = """() => {
  const box = document.querySelector('#runs');
  const table = box.querySelector('table.runs');
  const rows = {};
  for (const tr of table.querySelectorAll('tbody tr')) {
    const cells = {};
    for (const col of ['name', 'group', 'node', 'user']) {
      const el = tr.querySelector(`td.${col} bdi`);
      if (!el) continue;
      const cutter = el.closest('.cut') || el;
      const label = el.querySelector('.label');
      cells[col] = {
        title: el.title, text: el.textContent,
        cut: cutter.scrollWidth > cutter.clientWidth || el.scrollHeight > el.clientHeight + 1,
        label: label ? label.textContent : null,
        labelCut: label ? label.scrollWidth > label.clientWidth : null,
        shown: tr.querySelector(`td.${col}`).innerText,
      };
    }
    rows[tr.dataset.run] = cells;
  }
  return {table: table.scrollWidth, box: box.clientWidth,
          page: document.documentElement.scrollWidth, viewport: innerWidth, rows};
}"""


def runs_table(page: Any) -> dict[str, Any]:
    """The runs table's width, its box's, and its rows' text cells (see _CELLS)."""
    return page.evaluate(_CELLS)


def assert_fits_and_tells_apart(seen: dict[str, Any], full: dict[str, dict[str, str]]) -> None:
    """No sideways scroll; every text cell's tooltip is its whole value (so a
    cut one can be read); the two nodes read differently, their first label
    whole. *full*: run id -> column -> the value stored."""
    assert seen["table"] <= seen["box"], seen
    assert seen["page"] <= seen["viewport"], seen
    cut = 0
    for rid, cols in full.items():
        cells = seen["rows"][rid]
        for col, value in cols.items():
            cell = cells[col]
            assert cell["text"] == value, (rid, col, cell)
            assert cell["title"] == value, (rid, col, cell)  # cut or not: the whole value
            cut += cell["cut"]
    assert cut, "at 1400 px some of these values are cut: the test would prove nothing"
    nodes = [seen["rows"][rid]["node"] for rid in full]
    assert nodes[0]["shown"] != nodes[1]["shown"], nodes
    for node in nodes:  # "gpu-node-017" whole: what tells a cluster's nodes apart
        assert node["label"] == node["text"].split(".")[0] and not node["labelCut"], node
        assert node["shown"].startswith(node["label"]) and "\n" not in node["shown"], node
